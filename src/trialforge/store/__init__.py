"""Object storage (file:// and s3://) and the Parquet datasets published into it."""

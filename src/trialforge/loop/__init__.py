"""The RL loop: ``iteration`` reads top to bottom (evaluate, sample, roll out, verify, gate, update, sync); the
rest is what it stands on: ``records`` (what it stores and reads back), ``shards`` (a round cut into published,
resumable parts), ``staleness`` (rollouts overlapping updates), ``learner`` (the policy that trains).
"""

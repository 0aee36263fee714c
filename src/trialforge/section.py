"""The base of every settings section: unknown keys are errors (a typo never passes silently), values frozen."""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

"""Training: ``train(cfg) -> metrics`` (:mod:`tinymt.trainer.loop`), validation and its
TensorBoard logging (:mod:`~tinymt.trainer.validation`), checkpoint contents and resume
(:mod:`~tinymt.trainer.state`)."""

from tinymt.trainer.loop import train
from tinymt.trainer.state import resume_config

__all__ = ["resume_config", "train"]

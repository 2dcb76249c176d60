"""Training: ``train(cfg) -> metrics`` (:mod:`tinymt.trainer.loop`), validation and its
TensorBoard logging (:mod:`~tinymt.trainer.validation`), checkpoint contents and resume
(:mod:`~tinymt.trainer.state`)."""

from tinymt.trainer.loop import build_model, train
from tinymt.trainer.optim import lr_factor
from tinymt.trainer.state import resume_config
from tinymt.trainer.validation import validate

__all__ = ["build_model", "lr_factor", "resume_config", "train", "validate"]

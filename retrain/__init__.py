"""Retraining: trigger policies, data windows, jobs, backends and convergence."""

from retrain.backends import EpochOutcome, InProcessBackend, TrainingBackend
from retrain.convergence import ConvergenceRule, StopReason
from retrain.job import EpochRecord, JobResult, run_training, starting_model
from retrain.policies import POLICIES, AdwinPolicy, TriggerPolicy
from retrain.window import ChangeWindowPolicy, RatingsWindow, WindowPolicy, WindowSource

__all__ = [
    "POLICIES",
    "AdwinPolicy",
    "ChangeWindowPolicy",
    "ConvergenceRule",
    "EpochOutcome",
    "EpochRecord",
    "InProcessBackend",
    "JobResult",
    "RatingsWindow",
    "StopReason",
    "TrainingBackend",
    "TriggerPolicy",
    "WindowPolicy",
    "WindowSource",
    "run_training",
    "starting_model",
]

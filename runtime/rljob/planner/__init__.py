"""Planner: cost model, resource allocation, elastic-scaling gain, skew-aware
dispatch and a pipeline simulator. Pure functions; I/O stays in the CLI."""

from .allocation import Allocation, allocate_brute_force, allocate_cross, allocate_single
from .cost import Workload, generation_time, instance_time, training_time, wave_time
from ..infra.hardware import Hardware
from .profile import GenProfile, ModelShape, Profile, TrainProfile
from .scaling import decide, gain_of_one_more_replica, loss_of_one_fewer_replica

__all__ = [
    "Allocation",
    "GenProfile",
    "Hardware",
    "ModelShape",
    "Profile",
    "TrainProfile",
    "Workload",
    "allocate_brute_force",
    "allocate_cross",
    "allocate_single",
    "decide",
    "gain_of_one_more_replica",
    "generation_time",
    "instance_time",
    "loss_of_one_fewer_replica",
    "training_time",
    "wave_time",
]

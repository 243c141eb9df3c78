"""Performance model: step time, tokens/s, MFU, the breakdown and scaling of
any plan before it runs (pure Python; no torch)."""

from launcher.perf.params import PerfParams, load_params
from launcher.perf.steptime import Collective, Prediction, predict

__all__ = ["Collective", "PerfParams", "Prediction", "load_params", "predict"]

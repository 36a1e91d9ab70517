"""Repairs of a flipping update on ONNX files alone: weight interpolation and ensemble fallback."""

from flipgate.repair.ensemble import ensemble, ensemble_graph
from flipgate.repair.interpolate import interpolate, interpolate_graph, same_structure
from flipgate.repair.search import CurvePoint, Limits, RepairResult

__all__ = ["CurvePoint", "Limits", "RepairResult", "ensemble", "ensemble_graph", "interpolate",
           "interpolate_graph", "same_structure"]

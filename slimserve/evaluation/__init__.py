"""Evaluation: ranking and calibration metrics, and in-process speed of exported graphs."""

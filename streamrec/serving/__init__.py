"""Serving: export snapshots for Paddle Inference, score candidates, serve over HTTP."""

"""The MovieLens ml-latest-small ratings the demo and the backtest examples read (package data)."""

"""Replay and backtesting: recorded events through the consumers' logic and the learners, in
process, to compare update strategies on exactly the same samples (``streamrec replay``)."""

"""The micro-batch DIN learner: hashing, batches, the model, metrics."""

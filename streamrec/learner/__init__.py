"""The micro-batch DIN learner: hashing, batches, the model, metrics."""

# The top-level ``learner/`` folder is a link to this package, so from the repository root the
# same files could also import as ``learner``: two copies of every class. One name only.
if __name__ != "streamrec.learner":
    raise ImportError(f"import streamrec.learner, not {__name__}: learner/ is a link into streamrec/")

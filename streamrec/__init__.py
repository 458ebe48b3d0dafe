"""streamrec: a real-time incremental recommendation learner.

Click events flow through Kafka into per-user behaviour sequences held in Redis; point-in-time
training samples feed a DIN model in PaddlePaddle that learns in micro-batches and writes
versioned snapshots.
"""

__version__ = "0.1.0"

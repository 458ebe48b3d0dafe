"""Learner throughput against a bare Paddle loop, measured in the same run.

Ceiling: the same DIN scoring and then training on every micro-batch, already encoded into
tensor-ready arrays (the bare loop: the model's own compute). streamrec: the learner's whole
per-micro-batch path on the same samples, as the learner's loop takes it: decode and validate
the sample JSON into a SampleColumns, encode it (ids, id statistics), score (progressive
validation), train, mark known items, then the micro-batch's report (its metrics, the match
features' tells among them). The ratio is what decoding, id lookup and batch assembly cost.
Data: MovieLens latest-small (real ratings), samples built by the consumers' own logic on
the in-memory feature store; micro-batches of 2,500, one pass each. The process keeps freed
tensor memory for reuse (`streamrec.heapsettings`), as ``streamrec learner run`` does.

    .venv/bin/python bench/learner_throughput.py [--samples N] [--extras] [--train-batch N]
        [--learning-rate LR] [--mkl-default] [--parts P]

``--parts P``: micro-batches of P parts of 2,500 samples, each scored and trained as it is
gathered (`PartLearner.learn_part`, `streamrec.learner.parts`), one report and one close a
micro-batch, as the loop runs with ``part_s`` under ``interval_s`` (the defaults: 20 s parts
of a 180 s micro-batch). P 1: each micro-batch one part, trained whole.

FLOPs: counted from the model's own shapes, as the paper writes DIN (the attention's first
layer on the concatenation [q, k, q-k, q*k]; multiply-add = 2 FLOPs). With T the sequence
length and D the behaviour vector's width, one forward pass of one sample costs

    F = T * sum(2 * in * out over the attention MLP's Linear layers)
        + sum(2 * in * out over the head MLP's Linear layers) + 2 * (2 * T * D)

(the last term: the attention-weighted and the plain sum over the sequence). A sample is
scored once (F) and trained once (forward F + backward 2F): 4F per sample. The learner's
FLOP/s is 4F times its samples/s. The model computes fewer multiplications than F counts
(`streamrec.learner.model.attention_first_layer`), so this is the useful work, as a
per-sample FLOP budget. Ceiling: Paddle's matmul of the attention's first layer at the
model's own shape, [train_batch * T, 4D] x [4D, H1], forward, timed in the same run.

The floor under the model (``attention_products_only_samples_per_cpu_s_*``): the attention
MLP's matrix products alone (`attention_products`: scoring and training, forward and backward,
at the model's shapes), timed in thread CPU in the same run with Paddle's kernels and with
numpy's (one thread), as samples per CPU second: what a learner doing nothing else could reach
with those kernels. The learner runs these products in numpy on the CPU
(`streamrec.learner.numpy_attention`).

``--extras`` declares four features (genres: ids; rating: an outcome, standardized; device:
context; age: a user number, bucketed) and gives every sample values for them, derived from
its ids (the consumers' side fills them from real events).

Rates are given by the clock and by the process's CPU time (``*_per_cpu_s``), which holds
still while other jobs share the cores. The process takes MKL's vector kernels where
`streamrec.kernelsettings` would (``--mkl-default``: leave MKL's choice, the code before).

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
import zlib
from pathlib import Path

import msgspec
import numpy as np
import paddle
from threadpoolctl import threadpool_limits

from streamrec.config import ConsumerConfig, ModelConfig
from streamrec.consumers.processor import SampleBuilder
from streamrec.datasets import read_events
from streamrec.features import FeatureSchema, FeatureSpec
from streamrec.featurestore import MemoryFeatureStore
from streamrec.kafka.records import Record
from streamrec.kernelsettings import MKL_CPU_TYPE, prefer_vector_kernels
from streamrec.learner.columns import SampleColumns
from streamrec.learner.din import DINLearner
from streamrec.learner.model import DIN
from streamrec.learner.parts import MicroBatchParts
from streamrec.learner.reports import StepResult, scored_report
from streamrec.loopsettings import before_training_loop
from streamrec.samples import Sample

MOVIELENS = Path(__file__).resolve().parents[1] / "streamrec" / "demo_data" / "movielens-latest-small"
MICRO_BATCH = 2500
EXTRAS = FeatureSchema.of(
    [
        FeatureSpec(name="genres", kind="ids", max_ids=4),
        FeatureSpec(name="rating", kind="number", outcome=True, transform="standardize"),
        FeatureSpec(name="device", role="context"),
        FeatureSpec(
            name="age", kind="number", role="user", transform="bucket", boundaries=(18.0, 25.0, 35.0, 50.0)
        ),
    ]
)

# Matrix products as their operands' shapes, (left, right).
Shapes = list[tuple[tuple[int, ...], tuple[int, ...]]]


def _h(text: str) -> int:
    """A stable small hash (``hash`` differs between processes)."""
    return zlib.crc32(text.encode())


def with_extras(raw: bytes) -> bytes:
    """A sample with values for `EXTRAS`, derived from its ids."""
    s = Sample.from_json(raw)
    genres = (f"g{_h(s.item_id) % 20}", f"g{_h(s.category_id) % 20}")
    features = {"genres": genres, "device": f"d{_h(s.sample_id) % 4}", "age": float(_h(s.user_id) % 70)}
    seq = {
        "genres": tuple((f"g{_h(i) % 20}",) for i in s.seq_items),
        "rating": tuple(float(_h(i) % 5 + 1) for i in s.seq_items),
    }
    return msgspec.structs.replace(s, features=features, seq_features=seq).to_json()


def wire_samples(limit: int) -> list[bytes]:
    """The samples topic's records for the first ``limit`` MovieLens events, as the consumers make them."""
    events = read_events(MOVIELENS, limit=limit)
    builder = SampleBuilder(ConsumerConfig(), MemoryFeatureStore(ModelConfig().sequence_length))
    records = [Record(e.to_json(), i) for i, e in enumerate(events)]
    out: list[bytes] = []
    for i in range(0, len(records), 2000):
        result = builder.process(records[i : i + 2000])
        builder.commit(result)
        out.extend(s.to_json() for s in result.samples)
    return out


def forward_flops(model: DIN, sequence_length: int) -> int:
    """F: one sample's forward FLOPs as the paper writes DIN (the formula in the docstring)."""
    per_behaviour = sum(2 * int(w.shape[0]) * int(w.shape[1]) for w in _linear_weights(model.attention.score))
    head = sum(2 * int(w.shape[0]) * int(w.shape[1]) for w in _linear_weights(model.head.mlp))
    dim = int(model.attention.score[0].weight.shape[0]) // 4
    return sequence_length * per_behaviour + head + 2 * (2 * sequence_length * dim)


def _linear_weights(mlp: paddle.nn.Sequential) -> list[paddle.Tensor]:
    """The weights of an MLP's Linear layers, in order."""
    return [layer.weight for layer in mlp if isinstance(layer, paddle.nn.Linear)]


def matmul_ceiling(model: DIN, rows: int, seconds: float = 2.0) -> float:
    """FLOP/s of Paddle's matmul at the attention's first layer's shape, [rows, 4D] x [4D, H1]."""
    weight = model.attention.score[0].weight.detach()
    x = paddle.randn([rows, int(weight.shape[0])])
    paddle.matmul(x, weight).numpy()
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        paddle.matmul(x, weight).numpy()
        done += 1
    return done * 2 * rows * int(weight.shape[0]) * int(weight.shape[1]) / (time.perf_counter() - start)


def attention_products(model: DIN, cfg: ModelConfig) -> Shapes:
    """The attention MLP's matrix products in scoring and training one mini-batch, as operand shapes.

    For a mini-batch of B = ``cfg.train_batch_size`` samples, N = B * T rows: the first layer's
    batched product [B, T, D + 1] x [B, D + 1, H1] and each next layer's [N, H] x [H, H'] (the
    last, one unit wide, is a broadcast multiply: left out), forward twice (scoring, training);
    backward, the first layer's two batched products and each next layer's two.
    """
    b, t = cfg.train_batch_size, cfg.sequence_length
    d1 = int(model.attention.score[0].weight.shape[0]) // 4 + 1  # the keys' width, D + 1
    units = list(cfg.attention_units)
    layers = list(zip(units, units[1:], strict=False))
    forward: Shapes = [((b, t, d1), (b, d1, units[0])), *[((b * t, h), (h, g)) for h, g in layers]]
    backward: Shapes = [((b, t, units[0]), (b, units[0], d1)), ((b, d1, t), (b, t, units[0]))]
    for h, g in layers:
        backward += [((h, b * t), (b * t, g)), ((b * t, g), (g, h))]
    return [*forward, *forward, *backward]


def products_floor(model: DIN, cfg: ModelConfig, library: str, rounds: int = 20) -> float:
    """Samples per thread-CPU second if a sample cost only `attention_products`, in ``library``'s kernels.

    ``library`` "paddle" (its CPU wheel's MKL) or "numpy" (its OpenBLAS, one thread): the
    floor that the kernels alone put under the model, whatever else a step does.
    """
    arrays = [
        (np.random.rand(*left).astype(np.float32), np.random.rand(*right).astype(np.float32))
        for left, right in attention_products(model, cfg)
    ]
    tensors = [(paddle.to_tensor(a), paddle.to_tensor(b)) for a, b in arrays]
    times = []
    for _ in range(rounds):
        start = time.thread_time()
        if library == "paddle":
            for x, y in tensors:
                paddle.matmul(x, y)
        else:
            for a, b in arrays:
                np.matmul(a, b)
        times.append(time.thread_time() - start)
    return cfg.train_batch_size / float(np.median(times))


def main() -> None:
    """Measure and print the figures (``--help`` lists the knobs)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=40_000)
    parser.add_argument("--extras", action="store_true", help="four declared features (see above)")
    parser.add_argument("--train-batch", type=int, default=None, help="mini-batch (default: the config's)")
    parser.add_argument("--learning-rate", type=float, default=None, help="(default: the config's)")
    parser.add_argument(
        "--mkl-default", action="store_true", help="MKL chooses its own code path"
    )
    parser.add_argument(
        "--parts", type=int, default=1,
        help="micro-batches of this many parts, trained as each is gathered (`part_s`)",
    )
    args = parser.parse_args()
    if not args.mkl_default:
        prefer_vector_kernels()  # as the learner's commands do
    wire = wire_samples(args.samples)
    schema = EXTRAS if args.extras else FeatureSchema.default()
    if args.extras:
        wire = [with_extras(r) for r in wire]
    settings = {"train_batch_size": args.train_batch, "learning_rate": args.learning_rate}
    cfg = ModelConfig(**{k: v for k, v in settings.items() if v is not None})
    chunks = [wire[i : i + MICRO_BATCH] for i in range(0, len(wire), MICRO_BATCH)]

    # Ceiling: score and train, on batches encoded outside the timed region (by a learner
    # that has admitted ids and counted the same data, so its rows and id statistics are
    # those the run will see), by a model with as many rows as that learner ends with.
    counter = DINLearner(cfg, schema=schema)
    prepared = []
    for chunk in chunks:
        batch = SampleColumns.from_samples([Sample.from_json(r) for r in chunk])
        counter.admit(batch)
        prepared.append(counter.encode(batch))
        counter.count(batch)
    bare = DINLearner(cfg, rows=counter.rows, schema=schema)
    before_training_loop()  # for both loops, as `streamrec learner run` does before its loop
    start, cpu = time.perf_counter(), time.process_time()
    for encoded in prepared:
        bare.predict_encoded(encoded)
        bare.learn_encoded(encoded)
    ceiling = len(wire) / (time.perf_counter() - start)
    ceiling_cpu = len(wire) / (time.process_time() - cpu)

    learner = DINLearner(cfg, schema=schema)
    aucs: list[float] = []
    start, cpu = time.perf_counter(), time.process_time()
    parts = MicroBatchParts()
    for index, chunk in enumerate(chunks, 1):  # as `streamrec.learner.runner.LearnerRunner` does
        batch = SampleColumns.from_samples([Sample.from_json(r) for r in chunk])
        probs = learner.predict_many(batch)
        known = learner.is_known(batch)
        trained = learner.learn_part(batch) if args.parts > 1 else learner.learn_many(batch)
        parts.add([], StepResult(probs, known, trained, 0.0, 0.0), 0, batch)
        if len(parts.steps) == args.parts or index == len(chunks):  # the micro-batch's close
            if args.parts > 1:
                learner.end_micro_batch()
            scored, result = parts.merged()
            aucs.append(scored_report(len(aucs) + 1, scored, result, 0, 0).metrics.auc)
            parts = MicroBatchParts()
    rate = len(wire) / (time.perf_counter() - start)
    rate_cpu = len(wire) / (time.process_time() - cpu)
    after_10k = -(-10_000 // (MICRO_BATCH * args.parts))  # the micro-batches begun after 10,000 samples
    model = learner.model
    assert isinstance(model, DIN)  # noqa: S101 -- DINLearner builds one
    flops = 4 * forward_flops(model, cfg.sequence_length)
    peak = matmul_ceiling(model, cfg.train_batch_size * cfg.sequence_length)
    with threadpool_limits(1, user_api="blas"):  # as the learner's numpy attention runs
        floor_numpy = products_floor(model, cfg, "numpy")
    floor_paddle = products_floor(model, cfg, "paddle")
    print(
        json.dumps(
            {
                "bench": "learner_throughput",
                "samples": len(wire),
                "features": list(schema.names),
                "micro_batch": MICRO_BATCH,
                "parts": args.parts,
                "ceiling_samples_per_s": round(ceiling),
                "streamrec_samples_per_s": round(rate),
                "ratio_to_ceiling": round(rate / ceiling, 4),
                "bare_loop_samples_per_s": round(ceiling),
                "streamrec_samples_per_cpu_s": round(rate_cpu),
                "bare_loop_samples_per_cpu_s": round(ceiling_cpu),
                "mkl_debug_cpu_type": os.environ.get(MKL_CPU_TYPE),  # set here (streamrec's) or before
                "train_batch": cfg.train_batch_size,
                "learning_rate": cfg.learning_rate,
                "model_mflop_per_sample": round(flops / 1e6, 3),
                "learner_gflop_per_s": round(flops * rate / 1e9, 3),
                "bare_loop_gflop_per_s": round(flops * ceiling / 1e9, 3),
                "matmul_ceiling_gflop_per_s": round(peak / 1e9, 3),
                "learner_flop_ratio_to_matmul": round(flops * rate / peak, 4),
                "attention_products_only_samples_per_cpu_s_numpy": round(floor_numpy),
                "attention_products_only_samples_per_cpu_s_paddle": round(floor_paddle),
                "mean_progressive_auc_after_10k": round(float(np.nanmean(aucs[after_10k:])), 4),
                "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            }
        )
    )


if __name__ == "__main__":
    main()

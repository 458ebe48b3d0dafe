r"""The traffic plan: which users see which version while a canary or an A/B test runs.

``<root>/serving/TRAFFIC.json`` sits next to the serving pointer. Absent, every user gets the
version ``CURRENT`` names. Present, it names arms, each a version and a share of users in
basis points (1/100 of a percent) summing to 10,000::

    {"kind": "canary", "salt": "canary-v000008", "started": "...", "reason": "manual",
     "arms": [{"name": "canary", "version": 8, "share": 500},
              {"name": "served", "version": null, "share": 9500}]}

A user's arm is fixed by the xxh3 hash of ``salt`` and the user id, so a user always sees one
version while the plan stands, and a canary grown from 5% to 20% (same salt) keeps its first
users: the first arm takes the lowest buckets. An arm whose version is null follows
``CURRENT`` (a canary's ``served`` arm), so promoting the canary and ending the plan are safe
in either order. The file is replaced atomically under the pointer's lock
(`streamrec.snapshots.canary`), so serving reads it without one.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson
import xxhash

from streamrec.errors import SnapshotError
from streamrec.fileio import fsync_path, write_atomic
from streamrec.snapshots.directory import describe_os_error, version_name

TRAFFIC = "TRAFFIC.json"
BUCKETS = 10_000  # basis points: a share as fine as 0.01% of users
KINDS = ("canary", "ab")
SERVED = "served"  # the arm of a canary that stays on the served version
CANARY = "canary"
_MODE = 0o644  # serving may run as another user
_SHARE = re.compile(r"^\s*(\d+(?:\.\d{1,2})?)\s*%?\s*$")
_FINER = re.compile(r"^\s*\d+\.\d{3,}\s*%?\s*$")  # more than two decimals: under a basis point
_ARM_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")  # a Prometheus label value and a JSON field


@dataclass(frozen=True)
class Arm:
    """One arm: a name, the version it serves (None: the one ``CURRENT`` names) and a share."""

    name: str
    version: int | None
    share: int  # basis points

    def describe(self) -> str:
        """``canary=v000008:5.00%``."""
        version = "current" if self.version is None else version_name(self.version)
        return f"{self.name}={version}:{format_share(self.share)}"


@dataclass(frozen=True)
class TrafficPlan:
    """A canary or an A/B test: arms whose shares sum to `BUCKETS`."""

    kind: str
    salt: str
    arms: tuple[Arm, ...]
    started: str = ""
    reason: str = ""

    def __post_init__(self) -> None:
        """Refuse a plan that cannot route every user to exactly one arm.

        Raises:
            SnapshotError: naming what is wrong.
        """
        if self.kind not in KINDS:
            raise SnapshotError(f"traffic plan kind {self.kind!r} is not one of {KINDS}")
        if len(self.arms) < 2:
            raise SnapshotError("a traffic plan needs two arms or more")
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise SnapshotError(f"arm names must differ: {names}")
        for arm in self.arms:
            if not _ARM_NAME.match(arm.name):
                raise SnapshotError(f"arm name {arm.name!r}: 1-40 letters, digits, '_', '.' or '-'")
            if arm.share <= 0:
                share = format_share(arm.share)
                raise SnapshotError(f"arm {arm.name} has share {share}: give each arm more than 0%")
        total = sum(a.share for a in self.arms)
        if total != BUCKETS:
            shares = " + ".join(format_share(a.share) for a in self.arms)
            raise SnapshotError(f"shares must sum to 100%, not {shares} = {format_share(total)}")

    def arm_of(self, user_id: str) -> Arm:
        """The arm ``user_id`` is in: the same for as long as the plan (its salt) stands."""
        bucket = bucket_of(self.salt, user_id)
        for arm in self.arms:
            if bucket < arm.share:
                return arm
            bucket -= arm.share
        return self.arms[-1]  # not reached: the shares sum to BUCKETS

    def arm(self, name: str) -> Arm | None:
        """The arm called ``name``, if any."""
        return next((a for a in self.arms if a.name == name), None)

    def versions(self) -> set[int]:
        """The fixed versions the arms serve (a null arm's, CURRENT's, is not among them)."""
        return {a.version for a in self.arms if a.version is not None}

    def describe(self) -> str:
        """``canary canary=v000008:5.00% served=current:95.00%``."""
        return f"{self.kind} " + " ".join(a.describe() for a in self.arms)

    def to_json(self) -> bytes:
        """The file's bytes."""
        return orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2) + b"\n"

    @classmethod
    def from_json(cls, raw: bytes) -> TrafficPlan:
        """A plan from the file's bytes.

        Raises:
            SnapshotError: not a plan.
        """
        try:
            doc = orjson.loads(raw)
            arms = tuple(Arm(str(a["name"]), _version(a["version"]), int(a["share"])) for a in doc["arms"])
            return cls(
                str(doc["kind"]),
                str(doc["salt"]),
                arms,
                str(doc.get("started", "")),
                str(doc.get("reason", "")),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"not a traffic plan: {exc}") from exc


def _version(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"version {value!r} is not an integer")
    return value


def bucket_of(salt: str, user_id: str) -> int:
    """The user's bucket in [0, BUCKETS): xxh3 of ``salt``, a NUL and the user id."""
    return xxhash.xxh3_64_intdigest(f"{salt}\0{user_id}".encode()) % BUCKETS


def parse_share(text: str) -> int:
    """``5%``, ``5``, ``0.5%`` or ``12.25%``: basis points.

    Raises:
        SnapshotError: not a percentage between 0 and 100 with at most two decimals.
    """
    match = _SHARE.match(text)
    if match is None:
        if _FINER.match(text):
            raise SnapshotError(f"share {text!r} has more than two decimals: shares go in steps of 0.01%")
        raise SnapshotError(f"share {text!r} is not a percentage such as 5% or 0.5%")
    whole, _, frac = match.group(1).partition(".")
    share = int(whole) * 100 + int((frac + "00")[:2])
    if not 0 < share <= BUCKETS:
        raise SnapshotError(f"share {text!r} must be more than 0% and at most 100%")
    return share


def format_share(share: int) -> str:
    """Basis points as ``5.00%``."""
    return f"{share / 100:.2f}%"


def plan_path(root: Path) -> Path:
    """``<root>/serving/TRAFFIC.json``."""
    return Path(root) / "serving" / TRAFFIC


def read_plan(root: Path) -> TrafficPlan | None:
    """The plan in force, or None when every user gets the served version.

    Raises:
        SnapshotError: the file exists but cannot be read or is not a plan.
    """
    path = plan_path(root)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SnapshotError(f"cannot read {path}: {describe_os_error(exc)}") from exc
    try:
        return TrafficPlan.from_json(raw)
    except SnapshotError as exc:
        raise SnapshotError(f"{path}: {exc}; end it with `streamrec snapshot canary --abort`") from exc


def write_plan(root: Path, plan: TrafficPlan) -> None:
    """Replace the plan atomically. Call it holding the pointer's lock.

    Raises:
        SnapshotError: it cannot be written.
    """
    path = plan_path(root)
    try:
        write_atomic(path, plan.to_json(), _MODE)
    except OSError as exc:
        raise SnapshotError(f"cannot write {path}: {describe_os_error(exc)}") from exc


def remove_plan(root: Path) -> None:
    """Remove the plan (every user back on the served version). Call it holding the lock.

    Raises:
        SnapshotError: it cannot be removed.
    """
    path = plan_path(root)
    try:
        path.unlink(missing_ok=True)
        fsync_path(path.parent)
    except FileNotFoundError:  # no serving directory: nothing to remove
        return
    except OSError as exc:
        raise SnapshotError(f"cannot remove {path}: {describe_os_error(exc)}") from exc

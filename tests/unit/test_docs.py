"""The README, the docs pages and compose.yaml name only settings, commands and flags that exist;
the README stays a front page that links only to pages that exist; the generated references
cover every setting and command.

The site itself is built with ``mkdocs build --strict`` in CI (``./dev docs build``), which fails
on a broken link, a missing anchor or a page left out of the navigation.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from streamrec.config import StreamrecConfig
from streamrec.config.loading import NOT_SETTINGS, fields_of, is_section, is_setting

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# A front page, not a manual: what, why, the first commands, current figures, links.
README_MAX_LINES = 200
SETTING = re.compile(r"STREAMREC_[A-Z0-9_]+[A-Z0-9]")


def _settings_named(text: str) -> set[str]:
    return set(SETTING.findall(text)) - NOT_SETTINGS


PAGES = sorted(str(p.relative_to(ROOT)) for p in DOCS.rglob("*.md"))


@pytest.mark.parametrize("doc", ["README.md", "compose.yaml", *PAGES])
def test_every_documented_setting_exists(doc: str) -> None:
    names = _settings_named((ROOT / doc).read_text())
    if doc in ("README.md", "compose.yaml"):
        assert names, f"{doc} names no settings"
    assert sorted(n for n in names if not is_setting(n)) == []


def test_the_check_finds_a_setting_that_does_not_exist() -> None:
    assert is_setting("STREAMREC_KAFKA__BOOTSTRAP_SERVERS")
    assert not is_setting("STREAMREC_KAFKA__BOOTSTRAP_SERVER")
    assert not is_setting("STREAMREC_NOSECTION__URL")
    assert is_setting("STREAMREC_FEATURES") and not is_setting("STREAMREC_FEATURES__NAME")  # a list
    assert is_setting("STREAMREC_STORE__URL") and not is_setting("STREAMREC_STORE__CLIENT__DB")  # a dict


def test_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def _relative_links(text: str) -> list[str]:
    """Targets of Markdown links and images that are not URLs or in-page anchors."""
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t for t in targets if not re.match(r"^[a-z]+:|^#", t)]


def test_readme_links_only_to_files_that_exist() -> None:
    links = _relative_links((ROOT / "README.md").read_text())
    assert any(link.startswith("docs/") for link in links), "the README links into no docs page"
    missing = [link for link in links if not (ROOT / link.split("#")[0]).exists()]
    assert missing == []


def test_readme_links_into_the_pages_a_newcomer_needs() -> None:
    links = {link.split("#")[0] for link in _relative_links((ROOT / "README.md").read_text())}
    for page in ("docs/your-data.md", "docs/operating/deployment.md", "docs/getting-started.md"):
        assert page in links, f"the README does not link to {page}"


def _hook() -> ModuleType:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    spec = importlib.util.spec_from_file_location("docs_reference_hook", DOCS / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _all_settings(model: Any, prefix: str = "STREAMREC_") -> set[str]:
    found: set[str] = set()
    for name, annotation in fields_of(model).items():
        if is_section(annotation):
            found |= _all_settings(annotation, f"{prefix}{name.upper()}__")
        else:
            found.add(f"{prefix}{name.upper()}")
    return found


def test_the_configuration_reference_names_every_setting() -> None:
    page = _hook().configuration_page()
    settings = _all_settings(StreamrecConfig)
    assert "STREAMREC_STORE__URL" in settings and "STREAMREC_MODEL__TABLES" in settings
    assert sorted(s for s in settings if f"`{s}`" not in page) == []


def test_the_cli_reference_has_every_command() -> None:
    import typer

    from streamrec.cli import app

    page = _hook().cli_page()
    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="streamrec")
    commands: list[str] = []

    def walk(cmd: Any, context: Any, path: str) -> None:
        commands.append(path)
        for name in getattr(cmd, "list_commands", lambda _ctx: [])(context):
            sub = cmd.get_command(context, name)
            walk(sub, sub.context_class(sub, info_name=name, parent=context), f"{path} {name}")

    walk(root, ctx, "streamrec")
    assert "streamrec consumers run" in commands
    assert sorted(c for c in commands if f"`{c}`" not in page) == []


def _cli_tree() -> dict[str, set[str]]:
    """Command path ("streamrec snapshot list") -> the options it takes."""
    import typer

    from streamrec.cli import app

    tree: dict[str, set[str]] = {}

    def walk(cmd: Any, context: Any, path: str) -> None:
        options = {"--help"}
        for param in cmd.get_params(context):
            options.update(o for o in [*param.opts, *param.secondary_opts] if o.startswith("-"))
        tree[path] = options
        for name in getattr(cmd, "list_commands", lambda _ctx: [])(context):
            sub = cmd.get_command(context, name)
            walk(sub, sub.context_class(sub, info_name=name, parent=context), f"{path} {name}")

    root = typer.main.get_command(app)
    walk(root, root.context_class(root, info_name="streamrec"), "streamrec")
    return tree


def _code(text: str) -> list[str]:
    """The shell code of a Markdown page: fenced blocks (Mermaid and Python aside) and inline spans."""
    blocks = re.findall(r"^\s*```(\w*)\n(.*?)^\s*```", text, re.MULTILINE | re.DOTALL)
    prose = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.MULTILINE | re.DOTALL)
    shell = [body for lang, body in blocks if lang not in ("mermaid", "python")]
    return shell + re.findall(r"`([^`\n]+)`", prose)


def _invocations(text: str) -> list[tuple[str, list[str]]]:
    """Each ``streamrec ...`` invocation in the page's code: its words up to the end of the
    command (a pipe, ``&&``, ``;`` or a comment).
    """
    found = []
    for code in _code(text):
        for match in re.finditer(r"(?:^|[\s/])streamrec ([^\n#;&|]*)", code, re.MULTILINE):
            found.append((match.group(0), match.group(1).split()))
    return found


@pytest.mark.parametrize("doc", ["README.md", *PAGES])
def test_every_documented_command_and_flag_exists(doc: str) -> None:
    tree = _cli_tree()
    wrong = []
    for shown, words in _invocations((ROOT / doc).read_text()):
        path = "streamrec"
        for word in words:
            if f"{path} {word}" not in tree:
                break
            path = f"{path} {word}"
        if path == "streamrec" and words and re.fullmatch(r"[a-z]+", words[0]):
            wrong.append(f"{shown.strip()}: no command {words[0]!r}")
            continue
        for flag in (w.split("=")[0] for w in words if w.startswith("--")):
            if flag not in tree[path]:
                wrong.append(f"{shown.strip()}: `{path}` has no {flag}")
    assert wrong == []


def _metric_families() -> dict[str, str]:
    """Every metric family the learner, the consumers and the server expose: name -> type."""
    from streamrec.observability.consumer import ConsumerMetrics
    from streamrec.observability.lag import LagCollector
    from streamrec.observability.learner import LearnerMetrics
    from streamrec.serving.clicks import ClickCollector
    from streamrec.serving.http import ServingMetrics
    from streamrec.serving.routing import ArmEngines

    processes = (LearnerMetrics(), ConsumerMetrics(), ServingMetrics())
    families = [family for metrics in processes for family in metrics.registry.collect()]
    # the click join's, read from Redis at a scrape: without a plan collect() asks no Redis
    families += ClickCollector(None, lambda: None).collect()  # type: ignore[arg-type]
    families += ArmEngines(list).collect()  # each arm's engine, from the router
    for prefix in ("streamrec_learner", "streamrec_consumer"):
        # describe() names the lag families without asking a broker (the probe is never used)
        families += LagCollector(None, prefix).describe()  # type: ignore[arg-type]
    return {family.name: family.type for family in families}


def _metric_names() -> set[str]:
    """Every metric name the learner, the consumers and the server expose, as scraped."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
    return {
        name + suffix
        for name, kind in _metric_families().items()
        for suffix in ("", *suffixes.get(kind, ()))
    }


METRIC = re.compile(r"streamrec_(?:learner|consumer|serving)_[a-z_]+[a-z]")


def _metrics_named(text: str) -> set[str]:
    """The metric names a page gives, whole or shortened.

    A shortened name is a suffix of the whole name before it in its table cell or paragraph:
    `streamrec_learner_loss`, `_progressive_auc` name streamrec_learner_progressive_auc.
    """
    named = set(METRIC.findall(text))
    for chunk in re.split(r"\n\s*\n|\|", text):
        component = None
        for token in re.findall(r"`([a-z_*]+)", chunk):
            if METRIC.fullmatch(token):
                component = token.split("_")[1]
            elif token.startswith("_") and component is not None:
                named.add(f"streamrec_{component}{token}")
    return named


@pytest.mark.parametrize("doc", ["README.md", *PAGES])
def test_every_documented_metric_exists(doc: str) -> None:
    names = _metric_names()
    named = _metrics_named((ROOT / doc).read_text())
    assert sorted(n for n in named if not fnmatch.filter(names, n)) == []


def test_every_exposed_metric_is_documented() -> None:
    pages = ("operating/metrics.md", "serving.md")  # serve's own metrics are on the serving page
    named = _metrics_named("\n\n".join((DOCS / page).read_text() for page in pages))
    assert sorted(n for n in _metric_families() if n not in named and f"{n}_total" not in named) == []


def test_compose_runs_serve_on_the_snapshots_volume_with_its_port_and_readiness() -> None:
    import yaml  # type: ignore[import-untyped]  # PyYAML, which the docs extra (mkdocs) brings

    doc = yaml.safe_load((ROOT / "compose.yaml").read_text())
    serve = doc["services"]["serve"]
    assert serve["command"] == ["streamrec", "serve"]
    assert "snapshots:/snapshots" in serve["volumes"]
    env = serve["environment"]
    assert env["STREAMREC_LEARNER__SNAPSHOT_DIR"] == "/snapshots"
    assert env["STREAMREC_SERVING__HOST"] == "0.0.0.0"
    # /metrics is served on the HTTP port, so publishing it publishes the metrics.
    port = str(env["STREAMREC_SERVING__PORT"])
    assert f"{port}:{port}" in serve["ports"]
    assert f"127.0.0.1:{port}/readyz" in " ".join(serve["healthcheck"]["test"])
    # Every streamrec service shares the learner's snapshots.
    for name in ("learner", "serve"):
        assert "snapshots:/snapshots" in doc["services"][name]["volumes"]


def _compose_invocations() -> list[list[str]]:
    """Each streamrec command compose.yaml runs, and each its comments show, as its words."""
    import yaml

    text = (ROOT / "compose.yaml").read_text()
    services = yaml.safe_load(text)["services"].values()
    runs = [s["command"][1:] for s in services if s.get("command", [""])[0] == "streamrec"]
    comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    # a command word, then its arguments up to the end of the line or of a code span
    found = re.finditer(r"\bstreamrec ([a-z]+(?=[\s`)]|$)[^`)\n]*)", comments, re.MULTILINE)
    shown = [m.group(1).split() for m in found]
    return runs + shown


def test_every_compose_command_parses() -> None:
    """Run by hand, each command compose.yaml names gets past the CLI's parser: its arguments too."""
    import typer

    from streamrec.cli import app

    invocations = _compose_invocations()
    assert ["consumers", "run"] in invocations and ["serve"] in invocations
    wrong = []
    for words in invocations:
        command: Any = typer.main.get_command(app)
        path, rest = "streamrec", list(words)
        while rest and rest[0] in getattr(command, "commands", {}):
            command, path = command.commands[rest[0]], f"{path} {rest.pop(0)}"
        if hasattr(command, "commands"):
            wrong.append(f"{' '.join(words)}: `{path}` has no command {rest[:1]}")
            continue
        try:  # typer brings its own click: any error of the parser's is the invocation's
            command.make_context(path, rest)
        except Exception as exc:  # noqa: BLE001
            wrong.append(f"{' '.join(words)}: {exc}")
    assert wrong == []


# A setting's default as the pages quote it: `STREAMREC_X__Y` (50), `STREAMREC_X__Y`, 200,000)
QUOTED_DEFAULT = re.compile(
    r"`(STREAMREC_[A-Z0-9_]+)`,?\s+(?:\(|[a-z ]{0,30}\()?([0-9][0-9,.]*)(?: ([a-zA-Z]+))?"
)
# Units a quoted default is written in -> that many of the setting's own unit (its name's suffix).
SECONDS = {"ms": 0.001, "s": 1, "min": 60, "minutes": 60, "h": 3600, "hour": 3600, "hours": 3600,
           "day": 86400, "days": 86400}
BYTES = {"KiB": 1024, "MiB": 1 << 20, "KB": 1024, "MB": 1 << 20}


def _default(env: str) -> Any:  # noqa: ANN401 - any setting's value
    """The configuration's default for the setting named ``env``."""
    section, *names = env.removeprefix("STREAMREC_").lower().split("__")
    return functools.reduce(getattr, names, StreamrecConfig.model_fields[section].default)


def _in_setting_units(env: str, number: float, unit: str | None) -> float | None:
    """The quoted number in the setting's own unit; None if the unit is no unit of the setting's."""
    if unit in SECONDS and env.endswith(("_MS", "_S")):
        return number * SECONDS[unit] * (1000 if env.endswith("_MS") else 1)
    if unit in BYTES and env.endswith("_BYTES"):
        return number * BYTES[unit]
    return number if unit is None or unit not in SECONDS | BYTES else None


@pytest.mark.parametrize("doc", ["README.md", *PAGES])
def test_every_quoted_default_is_the_configurations(doc: str) -> None:
    wrong = []
    for env, number, unit in QUOTED_DEFAULT.findall((ROOT / doc).read_text()):
        if not is_setting(env) or env in NOT_SETTINGS:
            continue
        quoted = _in_setting_units(env, float(number.rstrip(",.").replace(",", "")), unit)
        default = _default(env)
        if isinstance(default, bool) or not isinstance(default, (int, float)) or quoted is None:
            continue
        if abs(quoted - default) > 1e-9 * max(1.0, abs(default)):
            wrong.append(f"{env}: quoted {number} {unit}, the default is {default}")
    assert wrong == []

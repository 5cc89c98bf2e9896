"""Every method a run names in pipelines/ is one the registry has (`hsk methods` lists them): a run that builds
its own stage (the masked-LM and causal-LM teachers) names none."""

from __future__ import annotations

import re
from pathlib import Path

from pipelines.methods import all_methods, get_method

ROOT = Path(__file__).resolve().parents[1]
NAMED = re.compile(r"""\bmethod=(["'])([^"']+)\1""")


def named_methods() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "pipelines").rglob("*.py")):
        for match in NAMED.finditer(path.read_text(encoding="utf-8")):
            found.setdefault(match.group(2), []).append(str(path.relative_to(ROOT)))
    return found


def test_every_method_named_in_pipelines_is_registered():
    named = named_methods()
    assert "finetune" in named  # `hsk teacher` runs the registered finetune method
    registered = {m.name for m in all_methods()}
    assert {name: where for name, where in named.items() if name not in registered} == {}
    for name in named:
        assert get_method(name).name == name


def test_the_lm_teachers_name_no_method():
    from pipelines.train.kinds import mlm_teacher

    assert mlm_teacher._options(8, 0, 100, False, "fp32").method is None

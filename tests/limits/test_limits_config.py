"""``[limits]`` errors name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from runq.config import load_config
from runq.errors import ConfigError
from runq.limits import LimitRules


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ('[limits."agent/*"]\nmax_running = 0', 'limits."agent/*".max_running'),
        ('[limits."agent/*"]\nmax_running = "four"', 'limits."agent/*".max_running'),
        ('[limits."agent/*"]\nmax_running_per_key = -1', 'limits."agent/*".max_running_per_key'),
        ('[limits."agent/*"]\nmax_runing = 4', 'limits."agent/*".max_runing'),
        ('[limits."task/email"]\nrate = "100/day"', 'limits."task/email".rate'),
        ('[limits."task/email"]\nrate = "0/second"', 'limits."task/email".rate'),
        ('[limits."task/email"]\nrate = 100', 'limits."task/email".rate'),
        ('[limits."Agent/x y"]\nmax_running = 1', 'limits."Agent/x y"'),
        ('[limits."agent/*"]', 'limits."agent/*"'),
        ("[limits]\nx = 3", 'limits."x"'),
    ],
)
def test_errors_name_the_key(tmp_path: Path, body: str, key: str) -> None:
    path = tmp_path / "runq.toml"
    path.write_text(body + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        load_config(path, environ={})
    assert raised.value.key == key, str(raised.value)


def test_limits_load_most_specific_first(tmp_path: Path) -> None:
    path = tmp_path / "runq.toml"
    path.write_text(
        '[limits."*"]\nmax_running = 50\n'
        '[limits."agent/*"]\nmax_running = 4\n'
        '[limits."agent/sum*"]\nrate = "10/minute"\n'
        '[limits."agent/summarize"]\nmax_running_per_key = 1\n',
        encoding="utf-8",
    )
    rules = LimitRules.from_config(load_config(path, environ={}))
    assert rules.patterns == ["agent/summarize", "agent/sum*", "agent/*", "*"]
    assert rules.groups[1].rate == (10, 60.0)
    assert rules.group_of("agent/summarize") == 0
    assert rules.group_of("agent/summary") == 1
    assert rules.group_of("agent/plan") == 2
    assert rules.group_of("task/x") == 3

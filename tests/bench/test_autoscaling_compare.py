"""bench/autoscaling_compare.py on a small trace: the JSON holds one table per rate scale and the must-show check."""
from __future__ import annotations

import json
import sys

from bench import autoscaling_compare

TRACE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         + "".join(f"2023-11-16 18:{17 + i // 60:02d}:{i % 60:02d}.0000000,5000,0\n" for i in range(240)))


def test_prints_every_rate_scale_and_the_must_show(tmp_path, capsys, monkeypatch):
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    monkeypatch.setattr(sys, "argv", ["autoscaling_compare.py", "--trace", str(trace), "--rate-scales", "1,2",
                                      "--preroll", "60", "--max-replicas", "6"])
    assert autoscaling_compare.main() == 0
    out = json.loads(capsys.readouterr().out)
    assert [t["rate_scale"] for t in out["tables"]] == [1, 2]
    for t in out["tables"]:
        assert t["rows"][0]["policy"] == "ours" and t["rows"][-1]["policy"] == "oracle"
        assert set(t["must_show"]) == {"ours_reaches_bar", "ours_over_cheapest_baseline", "ours_over_oracle", "met"}
        assert t["runs"] and all("setting" in r for r in t["runs"])

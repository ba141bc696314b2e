"""bench/tile_waves.py recomputes the committed waves.json from the raw evidence (issue 18)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import tile_waves
from tests.json_close import json_close

WAVES = Path("docs/evidence/h200-load-spread/waves.json")


def test_waves_json_recomputes_from_raw_evidence() -> None:
    committed = json.loads(WAVES.read_text())
    assert json_close(json.loads(json.dumps(tile_waves.report())), committed)


def test_launched_grid_is_vllm_em_not_the_tiles() -> None:
    # N = 384, 32-row blocks: EM = 8 * 384 + 128 * 31 = 7040 rows, 220 row blocks launched
    # whatever the counts; the tiles really run are 128 balanced.
    assert tile_waves.em(384, 32, expert_map=False) == 7040
    c = tile_waves._shape("tp1 bf16").config(384)
    assert (c.block_m, c.block_n) == (32, 256)
    # 132 tiles fill whole waves of both GEMMs (6 and 8 N tiles over 132 SMs); 133 spill.
    assert tile_waves.waves(132, c, 1) == (6, 8)
    assert tile_waves.waves(133, c, 1) == (7, 9)
    assert tile_waves.waves(133, c, 2) == (4, 5)


def test_the_committed_verdict() -> None:
    # The measured step between 132 and 133 uniform tiles at N = 384 is what waves predict.
    g = json.loads(WAVES.read_text())["groups"]["tp1 bf16 32"]
    m = g["models"]
    assert (
        m["waves r=2"]["left_out_N"]["rms_us_pooled"]
        < 0.5 * m["tiles"]["left_out_N"]["rms_us_pooled"]
    )
    uni = {
        r["tiles"]: r["excess_us"]
        for r in g["per_record"]
        if r["N"] == 384 and r["distribution"] == "uniform"
    }
    assert uni[133] - uni[132] > 15


def test_wave_probe_counts_run_the_asked_tiles() -> None:
    from moetables.tiles import row_tiles
    from scripts.h200_wave_probe import TOP_K, tile_counts, topk_ids

    for n, block in ((200, 32), (256, 32), (384, 32)):
        for j in range(0, 33):
            counts = tile_counts(n, block, j)
            assert sum(counts) == n * TOP_K and len(counts) == 128
            assert row_tiles(counts, block) == 128 + j
            rows = topk_ids(counts, n)
            assert all(len(set(r)) == TOP_K for r in rows)
            assert [sum(r.count(e) for r in rows) for e in range(128)] == counts

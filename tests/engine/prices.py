"""Drafters priced by hand in an engine's planner, for tests whose tiny models make real
timings price drafting unlike a real target would."""

import contextlib

from verispec.governor import CostModel

# Verify passes by rows, seconds, as the native kernels took them on 2 Zen 2 cores at 400
# tokens of context (benchmarks/verify_cost.py, medians of 9; 10-16 and 18-25 rows: 1.9 ms a
# row): the kernels' row tiles make the 5th, 9th and 17th rows dear.
MEASURED_ROWS = {m: ms / 1000 for m, ms in {1: 4.7, 2: 5.9, 3: 7.6, 4: 9.4, 5: 11.8, 6: 13.1, 7: 14.8}.items()}
MEASURED_ROWS |= {8: 0.0159, 9: 0.0188} | {m: 0.0188 + 0.0019 * (m - 9) for m in range(10, 17)}
MEASURED_ROWS |= {17: 0.036} | {m: 0.036 + 0.0019 * (m - 17) for m in range(18, 26)}


@contextlib.contextmanager
def drafter_prices(engine, name="suffix"):
    """Yields a setter of a drafter's round costs in the engine's planner (a verify row at the
    given share of a plain step, free proposals, calibrated and live alike); puts back what
    was there after."""
    planner = engine.planner
    saved = {table: dict(getattr(planner, table)) for table in ("calibrated", "live", "acceptance")}

    def set_costs(per_row: float) -> None:
        planner.calibrated[name] = CostModel.line(0.01, 0.01 * per_row)
        planner.live[name] = CostModel.line(0.01, 0.01 * per_row)
        planner.acceptance.pop(name, None)

    try:
        yield set_costs
    finally:
        for table, values in saved.items():
            setattr(planner, table, values)

"""Drafters priced by hand in an engine's planner, for tests whose tiny models make real
timings price drafting unlike a real target would."""

import contextlib

from verispec.governor import CostModel


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

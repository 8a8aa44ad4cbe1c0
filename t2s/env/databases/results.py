"""What running one statement gives back, whatever the engine: :class:`QueryResult`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class QueryResult:
    columns: list[str] = field(default_factory=list)
    rows: list[tuple] = field(default_factory=list)
    more: bool = False  # more rows existed beyond those fetched
    error: str | None = None
    timed_out: bool = False
    write_attempt: bool = False
    over_cap: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

"""Credit units and rates, in exact arithmetic.

Money is never a float: the ledger holds integer micro-credits, rates are exact fractions of a
micro-credit per byte-millisecond, and the fraction of a micro-credit a tick cannot bill is carried
to the next tick of the same meter, so a meter's entries add up to exactly the floor of its cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

MICRO = 1_000_000  # micro-credits per credit
GB = 1_000_000_000  # bytes per GB (decimal, as `memory_gb` and `size_gb` are shown)
MS_PER_SECOND = 1_000
MS_PER_HOUR = 3_600_000


def to_micro(credits: float | Decimal) -> int:
    """Credits as given on the wire → integer micro-credits (rounded to the nearest micro)."""
    return round(Fraction(str(credits)) * MICRO)


def cap_reached(spent_micro: int, cap: float | Decimal) -> bool:
    """Whether `spent_micro` micro-credits have reached a cap of `cap` credits: spent ≥ cap, exactly.
    Not `spent >= to_micro(cap)`: a cap under half a micro-credit rounds to 0 there and refused every
    request before any was billed."""
    return spent_micro >= math.ceil(Fraction(str(cap)) * MICRO)


def to_credits(micro: int) -> float:
    """Integer micro-credits → credits for the wire (exact to the sixth decimal)."""
    return micro / MICRO


@dataclass(frozen=True, slots=True)
class Rates:
    """Micro-credits per byte-millisecond, for replica memory and for stored artifacts."""

    compute: Fraction
    storage: Fraction | None  # None: storage is not billed
    min_memory_bytes: int

    @classmethod
    def per_gb(
        cls, compute_per_gb_second: Decimal, storage_per_gb_hour: Decimal | None, min_memory_gb: Decimal
    ) -> Rates:
        """From the operator's units: credits per GB-second of memory, per GB-hour of storage."""
        return cls(
            compute=Fraction(compute_per_gb_second) * MICRO / (GB * MS_PER_SECOND),
            storage=None
            if storage_per_gb_hour is None
            else Fraction(storage_per_gb_hour) * MICRO / (GB * MS_PER_HOUR),
            min_memory_bytes=math.ceil(Fraction(min_memory_gb) * GB),
        )

    def billed_memory(self, measured_bytes: int, processes: int = 1) -> int:
        """Memory billed for a replica: what it measures, at least the minimum per model process
        (a Ray Serve application scaled to zero has no process and costs nothing)."""
        return max(measured_bytes, self.min_memory_bytes * processes)


def charge(bytes_: int, milliseconds: int, rate: Fraction, carry: Fraction) -> tuple[int, Fraction]:
    """(whole micro-credits to bill now, the fraction carried to the next tick)."""
    exact = rate * bytes_ * milliseconds + carry
    amount = math.floor(exact)
    return amount, exact - amount


def carry_text(carry: Fraction) -> str:
    return f"{carry.numerator}/{carry.denominator}"

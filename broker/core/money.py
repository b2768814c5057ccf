"""Money as integer micro-dollars inside, decimal strings outside."""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_HALF_EVEN, Decimal

MICROS_PER_DOLLAR = 1_000_000
CENT = Decimal("0.01")


def to_micros(amount: Decimal | str | int) -> int:
    """Dollars to integer micro-dollars (exact for up to 6 decimals, else rounded half-even)."""
    value = Decimal(amount) * MICROS_PER_DOLLAR
    return int(value.to_integral_value(rounding=ROUND_HALF_EVEN))


def to_micros_ceil(amount: Decimal) -> int:
    """Dollars to micro-dollars, rounding up (what a bill or a worst case must do)."""
    return int((amount * MICROS_PER_DOLLAR).to_integral_value(rounding=ROUND_CEILING))


def from_micros(micros: int) -> Decimal:
    """Micro-dollars to a Decimal in dollars."""
    return Decimal(micros) / MICROS_PER_DOLLAR


def format_usd(micros: int) -> str:
    """Micro-dollars as the API's decimal string: cents always, more digits only when needed."""
    value = from_micros(micros)
    if micros % 10_000 == 0:
        return str(value.quantize(CENT))
    return format(value.normalize(), "f")


def cost_micros(price_per_hour_micros: int, seconds: float) -> int:
    """What ``seconds`` at an hourly price cost, rounded up to a whole micro-dollar."""
    return int(
        (Decimal(price_per_hour_micros) * Decimal(str(seconds)) / 3600).to_integral_value(
            rounding=ROUND_CEILING
        )
    )


def usd_text(micros: int) -> str:
    """Dollars for a message, rounded up to the cent: ``$25.20`` for 25,194,235 micro-USD."""
    cents = from_micros(micros).quantize(CENT, rounding=ROUND_CEILING)
    return f"${cents:,}"

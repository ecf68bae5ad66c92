"""A job with no deep learning in it at all."""

import sys

total = sum(i * i for i in range(100_000))
print(f"sum of squares: {total}")
sys.exit(3 if "--exit-3" in sys.argv else 0)

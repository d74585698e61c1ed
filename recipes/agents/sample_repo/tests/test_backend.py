"""Tests whose outcome depends on $CALC_BACKEND (see README.md)."""

import os
import unittest

from calc import mean, total


class TestBackend(unittest.TestCase):
    def test_backend_is_known(self) -> None:
        self.assertIn(os.environ.get("CALC_BACKEND", "exact"), ("exact", "fast"))

    def test_sum_of_tenths_is_exact(self) -> None:
        # Exact with fractions; 0.30000000000000004 with floats.
        self.assertEqual(total(["0.1", "0.2"]), total(["0.3"]))

    def test_mean(self) -> None:
        self.assertAlmostEqual(float(mean(["1", "2", "3", "4"])), 2.5)


if __name__ == "__main__":
    unittest.main()

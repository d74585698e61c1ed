import unittest

from calc import parse_expr


class TestParse(unittest.TestCase):
    def test_ops(self) -> None:
        self.assertEqual(parse_expr("6 * 7"), 42)
        self.assertEqual(parse_expr("10 - 4"), 6)
        self.assertEqual(parse_expr("9 / 3"), 3)

    def test_bad(self) -> None:
        for bad in ["", "1 +", "1 % 2", "a b c d"]:
            with self.subTest(expr=bad), self.assertRaises(ValueError):
                parse_expr(bad)


if __name__ == "__main__":
    unittest.main()

import unittest

from calc import add, fib, mul


class TestCore(unittest.TestCase):
    def test_add(self) -> None:
        self.assertEqual(add(2, 3), 5)

    def test_mul(self) -> None:
        self.assertEqual(mul(4, 5), 20)

    def test_fib(self) -> None:
        self.assertEqual([fib(i) for i in range(10)], [0, 1, 1, 2, 3, 5, 8, 13, 21, 34])
        self.assertEqual(fib(90), 2880067194370816120)

    def test_fib_negative(self) -> None:
        with self.assertRaises(ValueError):
            fib(-1)


if __name__ == "__main__":
    unittest.main()

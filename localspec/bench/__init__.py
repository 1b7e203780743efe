"""`localspec bench`: prompt suites, cost measurement, the method matrix and its tables."""

"""A Flower app: logistic regression on synthetic data, aggregated with sharefl's cluster
secure aggregation and a robust rule over the cluster sums."""

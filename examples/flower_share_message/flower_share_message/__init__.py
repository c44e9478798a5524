"""A Flower app written the Message-API way: logistic regression on synthetic data,
aggregated with sharefl's cluster secure aggregation and a robust rule over the cluster
sums."""

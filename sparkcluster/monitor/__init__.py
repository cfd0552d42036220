"""What shows a served cluster from outside: each node's metrics in the Prometheus text format (a rendering of
what sparkcluster already reads), the alert and recording rules and the dashboard (package data in rules/ and
dashboards/), and `sparkcluster monitor up | down | status`, which runs the distribution's Prometheus on the head."""

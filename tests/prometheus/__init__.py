"""The alert rules (deploy/prometheus/alerts.yaml) against a real relay: a recorder of its
/metrics under real faults (record.py, `make alert-series`), the promtool test file it writes
(alerts_test.yaml), and what both it and tests/integration/test_prometheus_rules.py start."""

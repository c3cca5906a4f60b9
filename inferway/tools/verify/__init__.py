"""``inferway verify``: the acceptance tests of a deployment, run against a live gateway.

From the policy alone it derives requests that cover every route and feature rule, computes
which pool each must reach (first match wins, as in Envoy), sends them, and checks the
served-by headers; then a bounded locust load run, and cost and utilisation when a
Prometheus or the admin API has them. The verdict is an exit code, so it can gate a rollout.
"""

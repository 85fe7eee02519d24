"""The Django project's own tests (shop/tests.py, shop/test_transactions.py) run under Django's
test runner, which tests/integration/test_django.py drives (`manage.py test shop`); pytest, with no
Django settings, collects none of them."""

collect_ignore_glob = ["*"]

"""A shop that announces its orders through the outbox: the Django project tests/integration/
test_django.py runs with manage.py, on the database SHOP_DATABASE describes (Django's DATABASES
entry, as JSON)."""

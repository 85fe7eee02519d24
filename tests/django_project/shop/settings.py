"""Settings of the test project; the database comes from SHOP_DATABASE (JSON)."""

from __future__ import annotations

import json
import os

import pymysql

# Django's mysql backend imports MySQLdb (mysqlclient, which needs a C build); PyMySQL stands in.
# Django asks for mysqlclient 1.4.3 or newer, and PyMySQL reports a version_info above that.
pymysql.install_as_MySQLdb()

SECRET_KEY = "only-for-the-tests"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
INSTALLED_APPS = [
    "outbox.django",  # its migrations create the outbox tables
    "shop",
]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "shop.urls"
DATABASES = {"default": json.loads(os.environ["SHOP_DATABASE"])}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
ORDERS_EXCHANGE = os.environ.get("SHOP_EXCHANGE", "orders")  # the tests give one of their own

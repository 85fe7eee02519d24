"""The test project's manage.py: `python manage.py migrate`, `python manage.py test shop`, ..."""

from __future__ import annotations

import os
import sys

from django.core.management import execute_from_command_line  # type: ignore[import-untyped]

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
    execute_from_command_line(sys.argv)

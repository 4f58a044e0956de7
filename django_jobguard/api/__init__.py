"""The REST API (``pip install django-jobguard[api]``): mount ``django_jobguard.api.urls``."""

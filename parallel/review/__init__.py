"""Plan reviews: the document (document.py, pure: compare, justify, Markdown/JSON) and its
SQLAlchemy store (store.py, the project's only database user).
"""

"""Keep every page under app.py's st.navigation, even on a fresh server's first deep link.

Streamlit (1.67) starts each server process in its legacy multipage mode whenever a `pages/`
folder sits beside the main script, until some run calls `st.navigation`. So the first session of a
fresh server that opens a shared link such as /topology runs pages/topology.py *directly*: no
app.py, so no wide layout, and a sidebar listing file names instead of our sections. A page that
calls `ensure_navigation()` first notices this and reruns through app.py, which resolves the same
URL path to the same page.
"""

from __future__ import annotations

import streamlit as st
from streamlit.runtime.pages_manager import PagesManager

ROUTED_KEY = "_routed_by_app"


def mark_routed() -> None:
    """Called by app.py before it runs a page: this session goes through st.navigation."""
    st.session_state[ROUTED_KEY] = True


def ensure_navigation() -> None:
    """Rerun through app.py if this page was started by Streamlit's legacy pages/ mode.

    Only a session app.py never routed can be in that mode, so a routed session (and AppTest, whose
    runs always start at app.py) never pays for the rerun, and a button's one-run click survives."""
    if PagesManager.uses_pages_directory and not st.session_state.get(ROUTED_KEY):
        PagesManager.uses_pages_directory = False  # what st.navigation itself does on its first call
        st.rerun()

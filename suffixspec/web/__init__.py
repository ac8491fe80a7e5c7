"""Static browser UI served by the suffixspec Flask app (HTML/JS/CSS only; no Python logic)."""

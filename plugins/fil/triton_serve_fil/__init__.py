"""triton-serve backend ``fil``: tree models (XGBoost, LightGBM, Treelite) served like Triton's FIL backend."""

"""The exercise notebooks' checkers and their feedback.
"""

"""Test support shared by test modules (harnesses, tiny synthetic models); no tests here."""

"""The operator's own informers: one list+watch thread per collection (listwatch.py), the
stores they fill (owned objects, the fleet, the Events that say why pods were refused or
could not mount), and the view a pass reads from them."""

# SPDX-License-Identifier: Apache-2.0
"""Unit items: conversions (km/h, m/s, mph, degrees, radians, metres, feet)."""

import math

from .drafts import collect, Draft, fixed, fmt, rounded


def _u_kmh_to_ms(rng):
    value, decimals = rng.randint(5, 130), rng.choice([1, 2])
    text = f'Convert {value} km/h to m/s. {rounded(decimals)}'
    return Draft('kmh_to_ms', text, fixed(value / 3.6, decimals), 'number')


def _u_ms_to_kmh(rng):
    value = rng.randint(5, 400) / 10
    text = f'The robot moves at {fmt(value, 1)} m/s. What is that in km/h? {rounded(1)}'
    return Draft('ms_to_kmh', text, fixed(value * 3.6, 1), 'number')


def _u_deg_to_rad(rng):
    value = rng.randint(1, 359)
    text = f'Convert a heading of {value} degrees to radians. {rounded(3)}'
    return Draft('deg_to_rad', text, fixed(math.radians(value), 3), 'number')


def _u_rad_to_deg(rng):
    value = rng.randint(5, 628) / 100
    text = (f'The steering angle set point is {fmt(value, 2)} rad. Convert it to degrees. '
            f'{rounded(1)}')
    return Draft('rad_to_deg', text, fixed(math.degrees(value), 1), 'number')


def _u_m_to_ft(rng):
    value = rng.randint(1, 500)
    text = f'The clearance is {value} m. How many feet is that? {rounded(1)}'
    return Draft('m_to_ft', text, fixed(value / 0.3048, 1), 'number')


def _u_ft_to_m(rng):
    value = rng.randint(1, 400)
    text = f'A bridge is marked {value} ft high. Convert the height to meters. {rounded(2)}'
    return Draft('ft_to_m', text, fixed(value * 0.3048, 2), 'number')


def _u_mph_to_kmh(rng):
    value = rng.choice([5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70])
    text = (f'A sign shows a limit of {value} mph. Convert it to km/h for the planner. '
            f'{rounded(1)}')
    return Draft('mph_to_kmh', text, fixed(value * 1.609344, 1), 'number')


def drafts(rng):
    """Return 28 distinct unit conversions, the templates taken in turn."""
    return collect(rng, [_u_kmh_to_ms, _u_ms_to_kmh, _u_deg_to_rad, _u_rad_to_deg,
                         _u_m_to_ft, _u_ft_to_m, _u_mph_to_kmh], 28)

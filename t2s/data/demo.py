"""The embedded demo data: two small databases (a cycling club, a village library) and questions, in BIRD's layout.

``python -m t2s data make-demo [--output DIR]`` writes, deterministically (default ``data/demo/``)::

    dev.json                      questions: question_id, db_id, question, evidence, SQL, difficulty
    dev_tables.json               the schemas in BIRD/Spider tables.json format, read back from the databases
    dev_databases/<db_id>/<db_id>.sqlite
    dev_databases/<db_id>/database_description/<table>.csv

All content (names, rows, questions) is invented here; rows come from a seeded ``random.Random``. Running the
generator twice gives byte-identical files for the same SQLite library version.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import random
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CYCLING_SEED = 20240611
LIBRARY_SEED = 20240612
PAGE_SIZE = 4096
DESCRIPTION_HEADER = ["original_column_name", "column_name", "column_description", "data_format", "value_description"]


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # declared SQLite type: INTEGER, TEXT or REAL
    constraint: str = ""  # e.g. "PRIMARY KEY", "NOT NULL REFERENCES clubs(club_id)"
    readable: str = ""  # BIRD's column_name: a human-readable name, empty when the original reads well
    description: str = ""
    values: str = ""  # BIRD's value_description


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    extra: tuple[str, ...] = ()  # table constraints, e.g. a composite PRIMARY KEY


CYCLING_TABLES: tuple[Table, ...] = (
    Table("clubs", (
        Column("club_id", "INTEGER", "PRIMARY KEY", "club id", "the unique identifier of the club"),
        Column("club_name", "TEXT", "NOT NULL", "club name", "the name of the club"),
        Column("city", "TEXT", "", "", "the city where the club is based"),
        Column("founded_year", "INTEGER", "", "founded year", "the year the club was founded"),
        Column("MonthlyFee", "REAL", "", "monthly fee", "the membership fee per month, in euros"),
    )),
    Table("members", (
        Column("member_id", "INTEGER", "PRIMARY KEY", "member id", "the unique identifier of the member"),
        Column("club_id", "INTEGER", "NOT NULL REFERENCES clubs(club_id)", "club id",
               "the club the member belongs to\nMaps to clubs(club_id)"),
        Column("first_name", "TEXT", "NOT NULL", "first name", "the member's first name"),
        Column("last_name", "TEXT", "NOT NULL", "last name", "the member's last name",
               "commonsense evidence:\nthe full name of a member is first_name followed by last_name"),
        Column("gender", "TEXT", "", "", "the member's gender",
               "'F' = female; 'M' = male; NULL = not stated"),
        Column("birth_year", "INTEGER", "", "birth year", "the year the member was born",
               "NULL when the member did not give it"),
        Column("JoinDate", "TEXT", "NOT NULL", "join date", "the date the member joined the club",
               "YYYY-MM-DD"),
        Column("EmailAddress", "TEXT", "", "email address", "the member's e-mail address",
               "NULL when the member gave none"),
        Column("is_active", "INTEGER", "NOT NULL", "is active", "whether the membership is current",
               "1 = active; 0 = lapsed"),
    )),
    Table("bikes", (
        Column("bike_id", "INTEGER", "PRIMARY KEY", "bike id", "the unique identifier of the bike"),
        Column("owner_id", "INTEGER", "NOT NULL REFERENCES members(member_id)", "owner id",
               "the member who owns the bike\nMaps to members(member_id)"),
        Column("brand", "TEXT", "NOT NULL", "", "the maker of the bike"),
        Column("bike_type", "TEXT", "NOT NULL", "bike type", "the kind of bike",
               "'road', 'gravel', 'mountain' or 'e-bike'"),
        Column("frame_material", "TEXT", "", "frame material", "what the frame is made of",
               "'aluminium', 'carbon', 'steel' or 'titanium'; NULL = unknown"),
        Column("purchase_price", "REAL", "", "purchase price", "what the owner paid for the bike, in euros"),
        Column("weight_kg", "REAL", "", "weight kg", "the weight of the bike in kilograms",
               "NULL when never weighed"),
        Column("purchase_date", "TEXT", "", "purchase date", "the date the bike was bought", "YYYY-MM-DD"),
    )),
    Table("routes", (
        Column("route_id", "INTEGER", "PRIMARY KEY", "route id", "the unique identifier of the route"),
        Column("club_id", "INTEGER", "NOT NULL REFERENCES clubs(club_id)", "club id",
               "the club that designed the route\nMaps to clubs(club_id)"),
        Column("route_name", "TEXT", "NOT NULL", "route name", "the name of the route"),
        Column("Start Point", "TEXT", "", "start point", "where rides on this route start"),
        Column("distance_km", "REAL", "NOT NULL", "distance km", "the length of the route in kilometres"),
        Column("elevation_gain_m", "INTEGER", "", "elevation gain m", "the total climbing in metres"),
        Column("surface", "TEXT", "", "", "the main road surface", "'paved', 'gravel' or 'mixed'"),
        Column("difficulty_level", "INTEGER", "", "difficulty level", "how hard the route is",
               "1 (easiest) to 5 (hardest)"),
    )),
    Table("rides", (
        Column("ride_id", "INTEGER", "PRIMARY KEY", "ride id", "the unique identifier of the group ride"),
        Column("route_id", "INTEGER", "NOT NULL REFERENCES routes(route_id)", "route id",
               "the route ridden\nMaps to routes(route_id)"),
        Column("club_id", "INTEGER", "NOT NULL REFERENCES clubs(club_id)", "club id",
               "the club that organised the ride\nMaps to clubs(club_id)"),
        Column("leader_id", "INTEGER", "REFERENCES members(member_id)", "leader id",
               "the member who led the ride\nMaps to members(member_id)", "NULL = no appointed leader"),
        Column("ride_date", "TEXT", "NOT NULL", "ride date", "the date of the ride", "YYYY-MM-DD"),
        Column("start_time", "TEXT", "", "start time", "the time the ride set off", "HH:MM, 24-hour clock"),
        Column("weather", "TEXT", "", "", "the weather during the ride",
               "'sunny', 'cloudy', 'rain' or 'windy'; NULL = not recorded"),
        Column("temperature_c", "REAL", "", "temperature c", "the air temperature at the start, in Celsius",
               "NULL = not recorded"),
    )),
    Table("Ride Participants", (
        Column("ride_id", "INTEGER", "NOT NULL REFERENCES rides(ride_id)", "ride id",
               "the ride\nMaps to rides(ride_id)"),
        Column("member_id", "INTEGER", "NOT NULL REFERENCES members(member_id)", "member id",
               "the member who took part\nMaps to members(member_id)"),
        Column("bike_id", "INTEGER", "REFERENCES bikes(bike_id)", "bike id",
               "the bike the member rode\nMaps to bikes(bike_id)",
               "NULL = an unregistered bike; the bike may belong to another member"),
        Column("FinishMinutes", "INTEGER", "", "finish minutes", "the member's riding time in minutes",
               "commonsense evidence:\nNULL means the member did not finish the ride"),
        Column("AvgSpeedKmh", "REAL", "", "average speed km/h",
               "the member's average speed in kilometres per hour", "NULL when the member did not finish"),
    ), ("PRIMARY KEY (ride_id, member_id)",)),
    Table("membership_payments", (
        Column("payment_id", "INTEGER", "PRIMARY KEY", "payment id", "the unique identifier of the payment"),
        Column("member_id", "INTEGER", "NOT NULL REFERENCES members(member_id)", "member id",
               "the member who paid\nMaps to members(member_id)"),
        Column("PaidOn", "TEXT", "NOT NULL", "paid on", "the date of the payment", "YYYY-MM-DD"),
        Column("amount", "REAL", "NOT NULL", "", "the amount paid, in euros"),
        Column("method", "TEXT", "", "", "how the member paid",
               "'card', 'cash' or 'bank transfer'; NULL = not recorded"),
        Column("period_year", "INTEGER", "NOT NULL", "period year", "the membership year the payment covers"),
    )),
)


def quote(name: str) -> str:
    """A SQLite identifier, double-quoted when it is not plain lower-case."""
    plain = name.replace("_", "a").isalnum() and name.islower() and not name[0].isdigit()
    return name if plain else '"' + name.replace('"', '""') + '"'


def create_statement(table: Table) -> str:
    parts = [f"    {quote(c.name)} {c.type}" + (f" {c.constraint}" if c.constraint else "") for c in table.columns]
    parts += [f"    {extra}" for extra in table.extra]
    return f"CREATE TABLE {quote(table.name)} (\n" + ",\n".join(parts) + "\n)"


# ---------------------------------------------------------------------------------------------------------------
# The cycling club database: rows

CLUBS = [
    ("Riverside Wheelers", "Aldermouth", 1987, 12.5),
    ("Hilltop Cadence", "Brackenford", 2004, 15.0),
    ("North Quay Riders", "Aldermouth", 2011, 10.0),
    ("Granite Spokes", "Carrow Heath", 1995, 18.0),
    ("Lantern Lane CC", "Dunmere", 2016, 9.5),
    ("Saltmarsh Velo", "Eastwick Bay", 1979, 14.0),
]
FIRST_NAMES = [
    "Ada", "Bram", "Cora", "Dmitri", "Elin", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kaia", "Luca", "Mira",
    "Nils", "Oona", "Pavel", "Quinn", "Rosa", "Soren", "Talia", "Ugo", "Vera", "Wim", "Ximena", "Yusuf", "Zora",
    "Anouk", "Basil", "Cleo", "Dario", "Esme", "Felix", "Gwen", "Hamid", "Ida", "Jasper",
]
LAST_NAMES = [
    "Ashdown", "Birchall", "Calloway", "Draper", "Ellery", "Fenwick", "Garside", "Holloway", "Ingram", "Jessop",
    "Kettering", "Lowry", "Marchetti", "Norcross", "Okafor", "Pemberton", "Quayle", "Rushworth", "Sandoval",
    "Thistlewood", "Underhill", "Varga", "Whitcombe", "Yardley", "Zeller", "Abernethy", "Brightwell", "Cordell",
]
BRANDS = ["Kestrel", "Ironfell", "Vantia", "Solano", "Brookline", "Tidewater", "Marlowe"]
BIKE_TYPES = ["road", "road", "road", "gravel", "gravel", "mountain", "e-bike"]
MATERIALS = ["aluminium", "carbon", "steel", "titanium"]
ROUTE_WORDS_A = ["Heron", "Copper", "Windmill", "Lark", "Old Mill", "Beacon", "Foxglove", "Chalk", "Harbour",
                 "Bluebell", "Quarry", "Orchard"]
ROUTE_WORDS_B = ["Loop", "Climb", "Circuit", "Ramble", "Dash", "Trail"]
START_POINTS = ["Market Square", "Station Car Park", "Clubhouse", "Bridge End", "Village Green", "Harbour Wall"]
SURFACES = ["paved", "paved", "paved", "gravel", "mixed"]
WEATHER = ["sunny", "cloudy", "cloudy", "rain", "windy"]
METHODS = ["card", "card", "bank transfer", "cash"]


def _date(rng: random.Random, start: dt.date, end: dt.date) -> str:
    return (start + dt.timedelta(days=rng.randrange((end - start).days + 1))).isoformat()


def cycling_rows(seed: int = CYCLING_SEED) -> dict[str, list[tuple]]:
    """Every cycling-club table's rows, in insertion order, from one seeded generator."""
    rng = random.Random(seed)
    rows: dict[str, list[tuple]] = {t.name: [] for t in CYCLING_TABLES}
    for club_id, (name, city, founded, fee) in enumerate(CLUBS, start=1):
        rows["clubs"].append((club_id, name, city, founded, fee))

    names = [(first, last) for first in FIRST_NAMES for last in LAST_NAMES]
    rng.shuffle(names)
    members = []
    for member_id, (first, last) in enumerate(names[:320], start=1):
        club_id = rng.choices(range(1, 7), weights=[22, 18, 16, 14, 10, 20])[0]
        gender = rng.choices(["F", "M", None], weights=[46, 48, 6])[0]
        birth_year = rng.randint(1950, 2006) if rng.random() > 0.07 else None
        joined = _date(rng, dt.date(2015, 1, 1), dt.date(2024, 12, 31))
        email = f"{first}.{last}@example.org".lower() if rng.random() > 0.15 else None
        active = 1 if rng.random() > 0.2 else 0
        members.append((member_id, club_id, first, last, gender, birth_year, joined, email, active))
    rows["members"] = members

    bikes_by_owner: dict[int, list[int]] = {}
    bike_id = 0
    for member in members:
        for _ in range(rng.choices([0, 1, 2, 3], weights=[12, 50, 28, 10])[0]):
            bike_id += 1
            kind = rng.choice(BIKE_TYPES)
            material = rng.choice(MATERIALS) if rng.random() > 0.1 else None
            price = round(rng.uniform(350, 2400) * (2.0 if material in ("carbon", "titanium") else 1.0)
                          * (1.6 if kind == "e-bike" else 1.0), 2)
            weight = None if rng.random() < 0.12 else round(
                rng.uniform(7.0, 10.5) + (8.0 if kind == "e-bike" else 0.0) + (3.0 if kind == "mountain" else 0.0), 1)
            bought = _date(rng, dt.date(2012, 1, 1), dt.date(2024, 10, 31))
            rows["bikes"].append((bike_id, member[0], rng.choice(BRANDS), kind, material, price, weight, bought))
            bikes_by_owner.setdefault(member[0], []).append(bike_id)

    route_names = [f"{a} {b}" for a in ROUTE_WORDS_A for b in ROUTE_WORDS_B]
    rng.shuffle(route_names)
    routes = []
    for route_id, name in enumerate(route_names[:36], start=1):
        distance = round(rng.uniform(18, 160), 1)
        climb = int(distance * rng.uniform(4, 22)) if rng.random() > 0.05 else None
        level = min(5, 1 + int(distance / 40) + (1 if (climb or 0) > 1500 else 0))
        routes.append((route_id, rng.randint(1, 6), name, rng.choice(START_POINTS), distance, climb,
                       rng.choice(SURFACES), level))
    rows["routes"] = routes

    members_by_club: dict[int, list[int]] = {}
    for member in members:
        members_by_club.setdefault(member[1], []).append(member[0])
    ride_dates = sorted(_date(rng, dt.date(2022, 1, 1), dt.date(2024, 12, 31)) for _ in range(520))
    for ride_id, ride_date in enumerate(ride_dates, start=1):
        route = rng.choice(routes)
        club_id = route[1] if rng.random() < 0.7 else rng.randint(1, 6)
        squad = members_by_club[club_id]
        leader = rng.choice(squad) if rng.random() > 0.08 else None
        start = f"{rng.choice([6, 7, 8, 9, 10, 18])}:{rng.choice(['00', '15', '30', '45'])}".zfill(5)
        weather = rng.choice(WEATHER) if rng.random() > 0.18 else None
        month = int(ride_date[5:7])
        temperature = round(rng.gauss(8 + 10 * (1 if 5 <= month <= 9 else 0), 4), 1) if rng.random() > 0.1 else None
        rows["rides"].append((ride_id, route[0], club_id, leader, ride_date, start, weather, temperature))

        riders = rng.sample(squad, k=min(len(squad), rng.randint(2, 8)))
        if leader is not None and leader not in riders:
            riders[0] = leader
        for member_id in sorted(riders):
            owned = bikes_by_owner.get(member_id, [])
            bike = rng.choice(owned) if owned and rng.random() > 0.1 else None
            if rng.random() < 0.04:  # a bike borrowed from another member
                bike = rng.randint(1, bike_id)
            if rng.random() < 0.07:
                minutes, speed = None, None
            else:
                speed = round(rng.uniform(17, 33) - route[7] * 0.8, 1)
                minutes = int(round(route[4] / speed * 60))
                speed = round(route[4] / (minutes / 60), 2)
            rows["Ride Participants"].append((ride_id, member_id, bike, minutes, speed))

    payment_id = 0
    fees = {club_id: fee for club_id, (_, _, _, fee) in enumerate(CLUBS, start=1)}
    for member in members:
        first_year = int(member[6][:4])
        last_year = 2024 if member[8] else min(2024, first_year + rng.randint(0, 3))
        for year in range(max(first_year, 2019), last_year + 1):
            if rng.random() < 0.1:
                continue
            payment_id += 1
            paid_on = member[6] if year == first_year else _date(rng, dt.date(year, 1, 1), dt.date(year, 3, 31))
            amount = round(fees[member[1]] * 12 * (0.9 if rng.random() < 0.25 else 1.0), 2)
            method = rng.choice(METHODS) if rng.random() > 0.05 else None
            rows["membership_payments"].append((payment_id, member[0], paid_on, amount, method, year))
    return rows


# ---------------------------------------------------------------------------------------------------------------
# The cycling club database: questions (every gold SQL returns rows; the generator checks it)

CYCLING_QUESTIONS: list[tuple[str, str, str, str]] = [
    # (question, evidence, SQL, difficulty)
    ("How many members does the club Granite Spokes have?",
     "Granite Spokes refers to club_name = 'Granite Spokes'",
     "SELECT COUNT(T1.member_id) FROM members AS T1 INNER JOIN clubs AS T2 ON T1.club_id = T2.club_id "
     "WHERE T2.club_name = 'Granite Spokes'", "simple"),
    ("Which clubs are based in Aldermouth?",
     "", "SELECT club_name FROM clubs WHERE city = 'Aldermouth'", "simple"),
    ("What is the name of the oldest club?",
     "oldest club refers to MIN(founded_year)",
     "SELECT club_name FROM clubs ORDER BY founded_year ASC LIMIT 1", "simple"),
    ("How many bikes are e-bikes?",
     "e-bikes refers to bike_type = 'e-bike'",
     "SELECT COUNT(*) FROM bikes WHERE bike_type = 'e-bike'", "simple"),
    ("List the names of the routes with a difficulty level of 5.",
     "difficulty level of 5 refers to difficulty_level = 5",
     "SELECT route_name FROM routes WHERE difficulty_level = 5", "simple"),
    ("How many members did not give an e-mail address?",
     "did not give an e-mail address refers to EmailAddress IS NULL",
     "SELECT COUNT(*) FROM members WHERE EmailAddress IS NULL", "simple"),
    ("How many members joined a club in 2020?",
     "joined in 2020 refers to JoinDate LIKE '2020%'",
     "SELECT COUNT(*) FROM members WHERE JoinDate LIKE '2020%'", "simple"),
    ("What is the average purchase price of carbon-framed bikes?",
     "carbon-framed refers to frame_material = 'carbon'; average purchase price = AVG(purchase_price)",
     "SELECT AVG(purchase_price) FROM bikes WHERE frame_material = 'carbon'", "simple"),
    ("What is the longest route, and how long is it?",
     "longest route refers to MAX(distance_km)",
     "SELECT route_name, distance_km FROM routes ORDER BY distance_km DESC LIMIT 1", "simple"),
    ("How many group rides took place in rain?",
     "in rain refers to weather = 'rain'",
     "SELECT COUNT(ride_id) FROM rides WHERE weather = 'rain'", "simple"),
    ("What is the monthly fee of the club Lantern Lane CC?",
     "", "SELECT MonthlyFee FROM clubs WHERE club_name = 'Lantern Lane CC'", "simple"),
    ("How many rides start from the Clubhouse?",
     "start from the Clubhouse refers to `Start Point` = 'Clubhouse'",
     "SELECT COUNT(T1.ride_id) FROM rides AS T1 INNER JOIN routes AS T2 ON T1.route_id = T2.route_id "
     "WHERE T2.`Start Point` = 'Clubhouse'", "simple"),
    ("List the brands and types of the bikes owned by Ada Ashdown.",
     "Ada Ashdown refers to first_name = 'Ada' AND last_name = 'Ashdown'",
     "SELECT T1.brand, T1.bike_type FROM bikes AS T1 INNER JOIN members AS T2 ON T1.owner_id = T2.member_id "
     "WHERE T2.first_name = 'Ada' AND T2.last_name = 'Ashdown'", "simple"),
    ("How many members of Saltmarsh Velo are no longer active?",
     "no longer active refers to is_active = 0",
     "SELECT COUNT(T1.member_id) FROM members AS T1 INNER JOIN clubs AS T2 ON T1.club_id = T2.club_id "
     "WHERE T2.club_name = 'Saltmarsh Velo' AND T1.is_active = 0", "simple"),
    ("How many participations ended without the rider finishing?",
     "did not finish refers to FinishMinutes IS NULL",
     'SELECT COUNT(*) FROM "Ride Participants" WHERE FinishMinutes IS NULL', "simple"),
    ("What is the total amount paid by card for the 2023 membership year?",
     "by card refers to method = 'card'; 2023 membership year refers to period_year = 2023",
     "SELECT SUM(amount) FROM membership_payments WHERE method = 'card' AND period_year = 2023", "simple"),
    ("Which brand of bike is the most common among the members?",
     "most common refers to MAX(COUNT(bike_id))",
     "SELECT brand FROM bikes GROUP BY brand ORDER BY COUNT(bike_id) DESC LIMIT 1", "simple"),
    ("What is the heaviest mountain bike's brand and weight?",
     "mountain bike refers to bike_type = 'mountain'; heaviest refers to MAX(weight_kg)",
     "SELECT brand, weight_kg FROM bikes WHERE bike_type = 'mountain' AND weight_kg IS NOT NULL "
     "ORDER BY weight_kg DESC LIMIT 1", "simple"),
    ("How many rides did each club organise? List the club name and the number of rides.",
     "",
     "SELECT T2.club_name, COUNT(T1.ride_id) FROM rides AS T1 INNER JOIN clubs AS T2 ON T1.club_id = T2.club_id "
     "GROUP BY T2.club_name", "moderate"),
    ("What is the average speed of finished rides on the route with the most climbing?",
     "most climbing refers to MAX(elevation_gain_m); finished refers to AvgSpeedKmh IS NOT NULL; "
     "average speed = AVG(AvgSpeedKmh)",
     'SELECT AVG(T1.AvgSpeedKmh) FROM "Ride Participants" AS T1 INNER JOIN rides AS T2 ON T1.ride_id = T2.ride_id '
     "WHERE T1.AvgSpeedKmh IS NOT NULL AND T2.route_id = "
     "(SELECT route_id FROM routes ORDER BY elevation_gain_m DESC LIMIT 1)", "moderate"),
    ("Which member led the most group rides? Give the full name.",
     "led refers to leader_id; full name refers to first_name, last_name; most refers to MAX(COUNT(ride_id))",
     "SELECT T2.first_name, T2.last_name FROM rides AS T1 INNER JOIN members AS T2 ON T1.leader_id = T2.member_id "
     "GROUP BY T1.leader_id ORDER BY COUNT(T1.ride_id) DESC, T1.leader_id LIMIT 1", "moderate"),
    ("In which month of 2023 did the most group rides take place?",
     "month refers to strftime('%m', ride_date); 2023 refers to ride_date LIKE '2023%'",
     "SELECT strftime('%m', ride_date) AS ride_month FROM rides WHERE strftime('%Y', ride_date) = '2023' "
     "GROUP BY ride_month ORDER BY COUNT(ride_id) DESC, ride_month LIMIT 1", "moderate"),
    ("What percentage of the bikes have a carbon frame?",
     "carbon frame refers to frame_material = 'carbon'; percentage = "
     "DIVIDE(COUNT(frame_material = 'carbon'), COUNT(bike_id)) * 100",
     "SELECT CAST(SUM(CASE WHEN frame_material = 'carbon' THEN 1 ELSE 0 END) AS REAL) * 100 / COUNT(bike_id) "
     "FROM bikes", "moderate"),
    ("How many distinct members took part in at least one ride in 2024?",
     "in 2024 refers to strftime('%Y', ride_date) = '2024'",
     "SELECT COUNT(DISTINCT T1.member_id) FROM `Ride Participants` AS T1 INNER JOIN rides AS T2 "
     "ON T1.ride_id = T2.ride_id WHERE strftime('%Y', T2.ride_date) = '2024'", "moderate"),
    ("List the names of the routes designed by Granite Spokes that have a gravel surface.",
     "designed by Granite Spokes refers to club_name = 'Granite Spokes'; gravel surface refers to "
     "surface = 'gravel'",
     "SELECT T1.route_name FROM routes AS T1 INNER JOIN clubs AS T2 ON T1.club_id = T2.club_id "
     "WHERE T2.club_name = 'Granite Spokes' AND T1.surface = 'gravel'", "moderate"),
    ("What is the average temperature of the rides led by women?",
     "women refers to gender = 'F'; average temperature = AVG(temperature_c)",
     "SELECT AVG(T1.temperature_c) FROM rides AS T1 INNER JOIN members AS T2 ON T1.leader_id = T2.member_id "
     "WHERE T2.gender = 'F'", "moderate"),
    ("Among the members who joined before 2018, how many are still active?",
     "joined before 2018 refers to JoinDate < '2018-01-01'; still active refers to is_active = 1",
     "SELECT COUNT(member_id) FROM members WHERE JoinDate < '2018-01-01' AND is_active = 1", "moderate"),
    ("How many rides had no appointed leader, and on how many distinct routes were they?",
     "no appointed leader refers to leader_id IS NULL",
     "SELECT COUNT(ride_id), COUNT(DISTINCT route_id) FROM rides WHERE leader_id IS NULL", "moderate"),
    ("What is the total amount of membership payments received by each club in 2024? List club name and total.",
     "in 2024 refers to PaidOn LIKE '2024%'; total = SUM(amount)",
     "SELECT T3.club_name, SUM(T1.amount) FROM membership_payments AS T1 INNER JOIN members AS T2 "
     "ON T1.member_id = T2.member_id INNER JOIN clubs AS T3 ON T2.club_id = T3.club_id "
     "WHERE T1.PaidOn LIKE '2024%' GROUP BY T3.club_name", "moderate"),
    ("Which members own more than two bikes? List their full names.",
     "more than two bikes refers to COUNT(bike_id) > 2; full name refers to first_name, last_name",
     "SELECT T2.first_name, T2.last_name FROM bikes AS T1 INNER JOIN members AS T2 ON T1.owner_id = T2.member_id "
     "GROUP BY T1.owner_id HAVING COUNT(T1.bike_id) > 2", "moderate"),
    ("How many times did members ride a titanium bike on a group ride?",
     "titanium bike refers to frame_material = 'titanium'",
     "SELECT COUNT(*) FROM `Ride Participants` AS T1 INNER JOIN bikes AS T2 ON T1.bike_id = T2.bike_id "
     "WHERE T2.frame_material = 'titanium'", "moderate"),
    ("What was the fastest average speed recorded on the Beacon Climb route?",
     "fastest average speed refers to MAX(AvgSpeedKmh); Beacon Climb refers to route_name = 'Beacon Climb'",
     'SELECT MAX(T1.AvgSpeedKmh) FROM "Ride Participants" AS T1 INNER JOIN rides AS T2 ON T1.ride_id = T2.ride_id '
     "INNER JOIN routes AS T3 ON T2.route_id = T3.route_id WHERE T3.route_name = 'Beacon Climb'", "moderate"),
    ("Classify the routes by length: how many are short, medium and long?",
     "short refers to distance_km < 50; medium refers to distance_km BETWEEN 50 AND 100; "
     "long refers to distance_km > 100",
     "SELECT CASE WHEN distance_km < 50 THEN 'short' WHEN distance_km <= 100 THEN 'medium' ELSE 'long' END "
     "AS length_class, COUNT(route_id) FROM routes GROUP BY length_class", "moderate"),
    ("What is the average age, in 2024, of the active members of Riverside Wheelers with a known birth year?",
     "age in 2024 = 2024 - birth_year; active refers to is_active = 1; known birth year refers to "
     "birth_year IS NOT NULL",
     "SELECT AVG(2024 - T1.birth_year) FROM members AS T1 INNER JOIN clubs AS T2 ON T1.club_id = T2.club_id "
     "WHERE T2.club_name = 'Riverside Wheelers' AND T1.is_active = 1 AND T1.birth_year IS NOT NULL",
     "moderate"),
    ("Which weather was most common on rides in July and August?",
     "July and August refers to strftime('%m', ride_date) IN ('07', '08'); weather recorded refers to "
     "weather IS NOT NULL",
     "SELECT weather FROM rides WHERE strftime('%m', ride_date) IN ('07', '08') AND weather IS NOT NULL "
     "GROUP BY weather ORDER BY COUNT(ride_id) DESC LIMIT 1", "moderate"),
    ("How many days passed between the first and the last group ride in the records?",
     "days between = julianday(MAX(ride_date)) - julianday(MIN(ride_date))",
     "SELECT julianday(MAX(ride_date)) - julianday(MIN(ride_date)) FROM rides", "moderate"),
    ("List the full names of the members who paid in cash for the 2022 membership year.",
     "paid in cash refers to method = 'cash'; 2022 membership year refers to period_year = 2022",
     "SELECT T2.first_name, T2.last_name FROM membership_payments AS T1 INNER JOIN members AS T2 "
     "ON T1.member_id = T2.member_id WHERE T1.method = 'cash' AND T1.period_year = 2022", "moderate"),
    ("For each bike type, what is the average weight of the bikes that were weighed?",
     "weighed refers to weight_kg IS NOT NULL",
     "SELECT bike_type, AVG(weight_kg) FROM bikes WHERE weight_kg IS NOT NULL GROUP BY bike_type", "moderate"),
    ("Which club's members completed the most kilometres in group rides in 2023?",
     "completed refers to FinishMinutes IS NOT NULL; kilometres refers to SUM(distance_km); "
     "in 2023 refers to strftime('%Y', ride_date) = '2023'",
     "SELECT T5.club_name FROM `Ride Participants` AS T1 INNER JOIN rides AS T2 ON T1.ride_id = T2.ride_id "
     "INNER JOIN routes AS T3 ON T2.route_id = T3.route_id INNER JOIN members AS T4 ON T1.member_id = T4.member_id "
     "INNER JOIN clubs AS T5 ON T4.club_id = T5.club_id WHERE T1.FinishMinutes IS NOT NULL "
     "AND strftime('%Y', T2.ride_date) = '2023' GROUP BY T5.club_id ORDER BY SUM(T3.distance_km) DESC LIMIT 1",
     "challenging"),
    ("Which members rode more kilometres in 2024 than the average member who rode that year? List full names.",
     "kilometres refers to SUM(distance_km) of finished rides; finished refers to FinishMinutes IS NOT NULL; "
     "in 2024 refers to strftime('%Y', ride_date) = '2024'",
     "WITH totals AS (SELECT T1.member_id, SUM(T3.distance_km) AS km FROM `Ride Participants` AS T1 "
     "INNER JOIN rides AS T2 ON T1.ride_id = T2.ride_id INNER JOIN routes AS T3 ON T2.route_id = T3.route_id "
     "WHERE T1.FinishMinutes IS NOT NULL AND strftime('%Y', T2.ride_date) = '2024' GROUP BY T1.member_id) "
     "SELECT T4.first_name, T4.last_name FROM totals INNER JOIN members AS T4 ON totals.member_id = T4.member_id "
     "WHERE totals.km > (SELECT AVG(km) FROM totals)", "challenging"),
    ("What percentage of the participations in rainy rides ended without the rider finishing?",
     "rainy refers to weather = 'rain'; did not finish refers to FinishMinutes IS NULL; percentage = "
     "DIVIDE(COUNT(FinishMinutes IS NULL), COUNT(*)) * 100",
     "SELECT CAST(SUM(CASE WHEN T1.FinishMinutes IS NULL THEN 1 ELSE 0 END) AS REAL) * 100 / COUNT(*) "
     'FROM "Ride Participants" AS T1 INNER JOIN rides AS T2 ON T1.ride_id = T2.ride_id WHERE T2.weather = \'rain\'',
     "challenging"),
    ("Which members rode a bike that they do not own on a group ride? List distinct full names.",
     "a bike they do not own refers to bike_id IS NOT NULL AND owner_id <> member_id",
     "SELECT DISTINCT T3.first_name, T3.last_name FROM `Ride Participants` AS T1 INNER JOIN bikes AS T2 "
     "ON T1.bike_id = T2.bike_id INNER JOIN members AS T3 ON T1.member_id = T3.member_id "
     "WHERE T2.owner_id <> T1.member_id", "challenging"),
    ("Among the rides on routes of difficulty 4 or more, what is the difference between the average speed in "
     "sunny weather and in rain?",
     "difficulty 4 or more refers to difficulty_level >= 4; difference = SUBTRACT(AVG(AvgSpeedKmh where "
     "weather = 'sunny'), AVG(AvgSpeedKmh where weather = 'rain'))",
     "SELECT AVG(CASE WHEN T2.weather = 'sunny' THEN T1.AvgSpeedKmh END) - "
     "AVG(CASE WHEN T2.weather = 'rain' THEN T1.AvgSpeedKmh END) FROM `Ride Participants` AS T1 "
     "INNER JOIN rides AS T2 ON T1.ride_id = T2.ride_id INNER JOIN routes AS T3 ON T2.route_id = T3.route_id "
     "WHERE T3.difficulty_level >= 4", "challenging"),
    ("Which route has been ridden by the largest number of distinct members? Give the route name and that number.",
     "distinct members refers to COUNT(DISTINCT member_id)",
     "SELECT T3.route_name, COUNT(DISTINCT T1.member_id) AS riders FROM `Ride Participants` AS T1 "
     "INNER JOIN rides AS T2 ON T1.ride_id = T2.ride_id INNER JOIN routes AS T3 ON T2.route_id = T3.route_id "
     "GROUP BY T3.route_id ORDER BY riders DESC, T3.route_id LIMIT 1", "challenging"),
    ("List the active members who do not own any registered bike. Give their full names.",
     "active refers to is_active = 1; own no registered bike refers to member_id not among bikes.owner_id",
     "SELECT T1.first_name, T1.last_name FROM members AS T1 WHERE T1.is_active = 1 AND NOT EXISTS "
     "(SELECT 1 FROM bikes AS T2 WHERE T2.owner_id = T1.member_id)", "moderate"),
    ("For the club Granite Spokes, how many members paid for the 2024 membership year less than twelve times the "
     "club's monthly fee?",
     "paid less than twelve times the monthly fee refers to amount < MonthlyFee * 12; 2024 membership year "
     "refers to period_year = 2024",
     "SELECT COUNT(DISTINCT T1.member_id) FROM membership_payments AS T1 INNER JOIN members AS T2 "
     "ON T1.member_id = T2.member_id INNER JOIN clubs AS T3 ON T2.club_id = T3.club_id "
     "WHERE T3.club_name = 'Granite Spokes' AND T1.period_year = 2024 AND T1.amount < T3.MonthlyFee * 12",
     "challenging"),
    ("How many members joined in 2021 and took part in a group ride within 90 days of joining?",
     "joined in 2021 refers to JoinDate LIKE '2021%'; within 90 days refers to "
     "julianday(ride_date) - julianday(JoinDate) BETWEEN 0 AND 90",
     "SELECT COUNT(DISTINCT T1.member_id) FROM members AS T1 INNER JOIN `Ride Participants` AS T2 "
     "ON T1.member_id = T2.member_id INNER JOIN rides AS T3 ON T2.ride_id = T3.ride_id "
     "WHERE T1.JoinDate LIKE '2021%' AND julianday(T3.ride_date) - julianday(T1.JoinDate) BETWEEN 0 AND 90",
     "challenging"),
    ("Which ride leader's rides had the highest average number of participants, among leaders who led at least "
     "five rides? Give the full name.",
     "at least five rides refers to COUNT(ride_id) >= 5; average number of participants = "
     "DIVIDE(COUNT(participations), COUNT(DISTINCT ride_id))",
     "SELECT T3.first_name, T3.last_name FROM rides AS T1 INNER JOIN `Ride Participants` AS T2 "
     "ON T1.ride_id = T2.ride_id INNER JOIN members AS T3 ON T1.leader_id = T3.member_id GROUP BY T1.leader_id "
     "HAVING COUNT(DISTINCT T1.ride_id) >= 5 "
     "ORDER BY CAST(COUNT(*) AS REAL) / COUNT(DISTINCT T1.ride_id) DESC, T1.leader_id LIMIT 1", "challenging"),
]


# ---------------------------------------------------------------------------------------------------------------
# The village library database

LIBRARY_TABLES: tuple[Table, ...] = (
    Table("branches", (
        Column("branch_id", "INTEGER", "PRIMARY KEY", "branch id", "the unique identifier of the branch"),
        Column("branch_name", "TEXT", "NOT NULL", "branch name", "the name of the library branch"),
        Column("district", "TEXT", "", "", "the district the branch serves", "NULL for the mobile library"),
        Column("OpenedOn", "TEXT", "", "opened on", "the date the branch opened", "YYYY-MM-DD"),
        Column("weekly_hours", "INTEGER", "", "weekly hours", "the number of opening hours per week"),
        Column("has_cafe", "INTEGER", "NOT NULL", "has cafe", "whether the branch has a cafe", "1 = yes; 0 = no"),
    )),
    Table("authors", (
        Column("author_id", "INTEGER", "PRIMARY KEY", "author id", "the unique identifier of the author"),
        Column("full_name", "TEXT", "NOT NULL", "full name", "the author's name as printed on the books"),
        Column("birth_year", "INTEGER", "", "birth year", "the year the author was born", "NULL = unknown"),
        Column("country", "TEXT", "", "", "the author's country", "NULL = unknown"),
    )),
    Table("books", (
        Column("book_id", "INTEGER", "PRIMARY KEY", "book id", "the unique identifier of the title"),
        Column("title", "TEXT", "NOT NULL", "", "the title of the book"),
        Column("author_id", "INTEGER", "NOT NULL REFERENCES authors(author_id)", "author id",
               "the author of the book\nMaps to authors(author_id)"),
        Column("genre", "TEXT", "", "", "the genre of the book",
               "'mystery', 'fantasy', 'history', 'science', 'poetry', 'children' or 'biography'"),
        Column("published_year", "INTEGER", "", "published year", "the year the book was first published"),
        Column("page_count", "INTEGER", "", "page count", "the number of pages", "NULL = unknown"),
        Column("ListPrice", "REAL", "", "list price", "the publisher's price, in euros"),
    )),
    Table("patrons", (
        Column("patron_id", "INTEGER", "PRIMARY KEY", "patron id", "the unique identifier of the library user"),
        Column("first_name", "TEXT", "NOT NULL", "first name", "the patron's first name"),
        Column("last_name", "TEXT", "NOT NULL", "last name", "the patron's last name"),
        Column("home_branch_id", "INTEGER", "NOT NULL REFERENCES branches(branch_id)", "home branch id",
               "the branch where the patron registered\nMaps to branches(branch_id)"),
        Column("Registered On", "TEXT", "NOT NULL", "registered on", "the date the patron got a library card",
               "YYYY-MM-DD"),
        Column("birth_year", "INTEGER", "", "birth year", "the year the patron was born", "NULL = not given"),
        Column("membership_tier", "TEXT", "NOT NULL", "membership tier", "the kind of library card",
               "'standard', 'student' or 'senior'"),
    )),
    Table("Book Copies", (
        Column("copy_id", "INTEGER", "PRIMARY KEY", "copy id", "the unique identifier of one physical copy"),
        Column("book_id", "INTEGER", "NOT NULL REFERENCES books(book_id)", "book id",
               "the title this is a copy of\nMaps to books(book_id)"),
        Column("branch_id", "INTEGER", "NOT NULL REFERENCES branches(branch_id)", "branch id",
               "the branch that holds the copy\nMaps to branches(branch_id)"),
        Column("acquired_on", "TEXT", "", "acquired on", "the date the library acquired the copy", "YYYY-MM-DD"),
        Column("condition", "TEXT", "", "", "the physical state of the copy",
               "'new', 'good', 'worn' or 'damaged'; NULL = not inspected"),
    )),
    Table("loans", (
        Column("loan_id", "INTEGER", "PRIMARY KEY", "loan id", "the unique identifier of the loan"),
        Column("copy_id", "INTEGER", 'NOT NULL REFERENCES "Book Copies"(copy_id)', "copy id",
               "the copy that was lent\nMaps to Book Copies(copy_id)"),
        Column("patron_id", "INTEGER", "NOT NULL REFERENCES patrons(patron_id)", "patron id",
               "the patron who borrowed the copy\nMaps to patrons(patron_id)"),
        Column("loaned_on", "TEXT", "NOT NULL", "loaned on", "the date the copy was lent", "YYYY-MM-DD"),
        Column("due_on", "TEXT", "NOT NULL", "due on", "the date the copy was due back", "YYYY-MM-DD"),
        Column("returned_on", "TEXT", "", "returned on", "the date the copy came back",
               "commonsense evidence:\nNULL means the copy has not been returned"),
        Column("late_fee", "REAL", "", "late fee", "the fee charged for a late return, in euros",
               "0 when returned on time; NULL while not returned"),
    )),
)

BRANCHES = [
    ("Central", "Old Town", "1962-04-02", 60, 1),
    ("Millbrook", "Millbrook", "1988-09-15", 42, 0),
    ("Harbourside", "Docklands", "2005-03-01", 48, 1),
    ("Elm Park", "Elm Park", "1974-11-20", 36, 0),
    ("Westgate Mobile", None, "2012-06-04", 20, 0),
]
AUTHOR_FIRST = ["Marguerite", "Tobias", "Selin", "Augustin", "Hana", "Florian", "Imogen", "Kwame", "Lucia",
                "Matthias", "Noor", "Oskar", "Priya", "Rafael", "Sigrid", "Teodor"]
AUTHOR_LAST = ["Alder", "Bellweather", "Castellan", "Dunmore", "Everly", "Fairbairn", "Greaves", "Hollis",
               "Ivers", "Janssen", "Kowal", "Linden"]
COUNTRIES = ["Ireland", "Canada", "Norway", "Portugal", "Kenya", "India", "Chile", "Poland"]
TITLE_ADJECTIVES = ["Silent", "Crimson", "Hollow", "Northern", "Forgotten", "Glass", "Winter", "Hidden", "Last",
                    "Paper", "Copper", "Wandering", "Quiet", "Salt"]
TITLE_NOUNS = ["Lighthouse", "Orchard", "Cartographer", "Garden", "Harbour", "Clockmaker", "Meadow", "Archive",
               "River", "Kingdom", "Letters", "Observatory", "Ferryman", "Atlas", "Tides", "Beekeeper"]
GENRES = ["mystery", "fantasy", "history", "science", "poetry", "children", "biography"]
PATRON_FIRST = ["Abel", "Bettina", "Casper", "Delia", "Emil", "Fenna", "Gideon", "Hester", "Isak", "Juno", "Konrad",
                "Liesel", "Marius", "Nadia", "Otto", "Petra", "Ruben", "Saskia", "Tomas", "Wilma"]
PATRON_LAST = ["Ambrose", "Blackwood", "Crane", "Dalby", "Eastman", "Frost", "Gilchrist", "Hale", "Ivory", "Kemp",
               "Lockhart", "Moss", "Nightingale", "Orme", "Pryce", "Redfern"]
CONDITIONS = ["new", "good", "good", "worn", "damaged"]


def library_rows(seed: int = LIBRARY_SEED) -> dict[str, list[tuple]]:
    """Every village-library table's rows, in insertion order, from one seeded generator."""
    rng = random.Random(seed)
    rows: dict[str, list[tuple]] = {t.name: [] for t in LIBRARY_TABLES}
    rows["branches"] = [(i, *branch) for i, branch in enumerate(BRANCHES, start=1)]

    author_names = [f"{first} {last}" for first in AUTHOR_FIRST for last in AUTHOR_LAST]
    rng.shuffle(author_names)
    for author_id, name in enumerate(author_names[:60], start=1):
        birth = rng.randint(1920, 1995) if rng.random() > 0.1 else None
        country = rng.choice(COUNTRIES) if rng.random() > 0.12 else None
        rows["authors"].append((author_id, name, birth, country))

    titles = [f"The {a} {n}" for a in TITLE_ADJECTIVES for n in TITLE_NOUNS]
    rng.shuffle(titles)
    for book_id, title in enumerate(titles[:220], start=1):
        genre = rng.choice(GENRES)
        short = genre in ("children", "poetry")
        pages = None if rng.random() < 0.08 else rng.randint(40 if short else 150, 160 if short else 820)
        price = round(rng.uniform(6, 32), 0) - 0.01
        rows["books"].append((book_id, title, rng.randint(1, 60), genre, rng.randint(1950, 2021), pages, price))

    patron_names = [(first, last) for first in PATRON_FIRST for last in PATRON_LAST]
    rng.shuffle(patron_names)
    for patron_id, (first, last) in enumerate(patron_names[:260], start=1):
        tier = rng.choices(["standard", "student", "senior"], weights=[60, 22, 18])[0]
        birth = None if rng.random() < 0.1 else (
            rng.randint(1995, 2010) if tier == "student" else rng.randint(1940, 1962) if tier == "senior"
            else rng.randint(1960, 2000))
        registered = _date(rng, dt.date(2012, 1, 1), dt.date(2024, 6, 30))
        rows["patrons"].append((patron_id, first, last, rng.choices(range(1, 6), weights=[35, 20, 20, 15, 10])[0],
                                registered, birth, tier))

    for copy_id in range(1, 481):
        condition = rng.choice(CONDITIONS) if rng.random() > 0.1 else None
        branch_id = rng.choices(range(1, 6), weights=[35, 20, 20, 15, 10])[0]
        acquired = _date(rng, dt.date(2010, 1, 1), dt.date(2021, 12, 31))
        rows["Book Copies"].append((copy_id, rng.randint(1, 220), branch_id, acquired, condition))

    end = dt.date(2024, 12, 31)
    loan_dates = sorted(_date(rng, dt.date(2022, 1, 1), dt.date(2024, 12, 20)) for _ in range(1600))
    for loan_id, loaned in enumerate(loan_dates, start=1):
        out = dt.date.fromisoformat(loaned)
        due = out + dt.timedelta(days=21)
        back = out + dt.timedelta(days=rng.choices([rng.randint(3, 21), rng.randint(22, 60)], weights=[78, 22])[0])
        if back > end or rng.random() < 0.03:
            returned, fee = None, None
        else:
            returned, fee = back.isoformat(), round(0.25 * max(0, (back - due).days), 2)
        rows["loans"].append((loan_id, rng.randint(1, 480), rng.randint(1, 260), loaned, due.isoformat(),
                              returned, fee))
    return rows


LIBRARY_QUESTIONS: list[tuple[str, str, str, str]] = [
    ("How many book copies does the Harbourside branch hold?",
     "Harbourside refers to branch_name = 'Harbourside'",
     "SELECT COUNT(T1.copy_id) FROM `Book Copies` AS T1 INNER JOIN branches AS T2 ON T1.branch_id = T2.branch_id "
     "WHERE T2.branch_name = 'Harbourside'", "simple"),
    ("Which branch has no district recorded?",
     "no district recorded refers to district IS NULL",
     "SELECT branch_name FROM branches WHERE district IS NULL", "simple"),
    ("How many loans have not been returned yet?",
     "not returned refers to returned_on IS NULL",
     "SELECT COUNT(loan_id) FROM loans WHERE returned_on IS NULL", "simple"),
    ("What is the average number of pages of the fantasy books?",
     "fantasy refers to genre = 'fantasy'; average number of pages = AVG(page_count)",
     "SELECT AVG(page_count) FROM books WHERE genre = 'fantasy'", "simple"),
    ("How many patrons got their library card in 2023?",
     "got their library card in 2023 refers to `Registered On` LIKE '2023%'",
     "SELECT COUNT(patron_id) FROM patrons WHERE `Registered On` LIKE '2023%'", "simple"),
    ("How many books were written by authors from Norway?",
     "from Norway refers to country = 'Norway'",
     "SELECT COUNT(T1.book_id) FROM books AS T1 INNER JOIN authors AS T2 ON T1.author_id = T2.author_id "
     "WHERE T2.country = 'Norway'", "simple"),
    ("List the titles of the books written by Oskar Kowal.",
     "Oskar Kowal refers to full_name = 'Oskar Kowal'",
     "SELECT T1.title FROM books AS T1 INNER JOIN authors AS T2 ON T1.author_id = T2.author_id "
     "WHERE T2.full_name = 'Oskar Kowal'", "simple"),
    ("Which genre has been borrowed the most often?",
     "borrowed the most often refers to MAX(COUNT(loan_id))",
     "SELECT T3.genre FROM loans AS T1 INNER JOIN `Book Copies` AS T2 ON T1.copy_id = T2.copy_id "
     "INNER JOIN books AS T3 ON T2.book_id = T3.book_id GROUP BY T3.genre ORDER BY COUNT(T1.loan_id) DESC LIMIT 1",
     "moderate"),
    ("What is the total of the late fees charged for copies held by each branch? List branch name and total.",
     "total of the late fees = SUM(late_fee)",
     'SELECT T3.branch_name, SUM(T1.late_fee) FROM loans AS T1 INNER JOIN "Book Copies" AS T2 '
     "ON T1.copy_id = T2.copy_id INNER JOIN branches AS T3 ON T2.branch_id = T3.branch_id "
     "GROUP BY T3.branch_name", "moderate"),
    ("How many loans were returned after their due date?",
     "returned after the due date refers to returned_on > due_on",
     "SELECT COUNT(loan_id) FROM loans WHERE returned_on > due_on", "moderate"),
    ("Which books have copies in at least four different branches? List the titles.",
     "at least four different branches refers to COUNT(DISTINCT branch_id) >= 4",
     "SELECT T1.title FROM books AS T1 INNER JOIN `Book Copies` AS T2 ON T1.book_id = T2.book_id "
     "GROUP BY T1.book_id HAVING COUNT(DISTINCT T2.branch_id) >= 4", "moderate"),
    ("On average, how many days did patrons keep the mystery books they have returned?",
     "mystery refers to genre = 'mystery'; days kept = julianday(returned_on) - julianday(loaned_on); "
     "returned refers to returned_on IS NOT NULL",
     "SELECT AVG(julianday(T1.returned_on) - julianday(T1.loaned_on)) FROM loans AS T1 "
     "INNER JOIN `Book Copies` AS T2 ON T1.copy_id = T2.copy_id INNER JOIN books AS T3 ON T2.book_id = T3.book_id "
     "WHERE T3.genre = 'mystery' AND T1.returned_on IS NOT NULL", "moderate"),
    ("How many patrons have borrowed a copy held by a branch other than their home branch?",
     "a branch other than their home branch refers to branch_id <> home_branch_id",
     "SELECT COUNT(DISTINCT T1.patron_id) FROM loans AS T1 INNER JOIN `Book Copies` AS T2 "
     "ON T1.copy_id = T2.copy_id INNER JOIN patrons AS T3 ON T1.patron_id = T3.patron_id "
     "WHERE T2.branch_id <> T3.home_branch_id", "challenging"),
    ("Whose books have been borrowed by the largest number of different patrons? Give the author's name.",
     "different patrons refers to COUNT(DISTINCT patron_id)",
     "SELECT T4.full_name FROM loans AS T1 INNER JOIN `Book Copies` AS T2 ON T1.copy_id = T2.copy_id "
     "INNER JOIN books AS T3 ON T2.book_id = T3.book_id INNER JOIN authors AS T4 ON T3.author_id = T4.author_id "
     "GROUP BY T4.author_id ORDER BY COUNT(DISTINCT T1.patron_id) DESC LIMIT 1", "challenging"),
    ("What percentage of the returned loans of student-card patrons came back late?",
     "student-card refers to membership_tier = 'student'; returned refers to returned_on IS NOT NULL; came back "
     "late refers to returned_on > due_on; percentage = DIVIDE(COUNT(returned_on > due_on), COUNT(loan_id)) * 100",
     "SELECT CAST(SUM(CASE WHEN T1.returned_on > T1.due_on THEN 1 ELSE 0 END) AS REAL) * 100 / COUNT(T1.loan_id) "
     "FROM loans AS T1 INNER JOIN patrons AS T2 ON T1.patron_id = T2.patron_id "
     "WHERE T2.membership_tier = 'student' AND T1.returned_on IS NOT NULL", "challenging"),
]


# ---------------------------------------------------------------------------------------------------------------
# Writing


@dataclass(frozen=True)
class DemoDatabase:
    db_id: str
    tables: tuple[Table, ...]
    rows: Callable[[], dict[str, list[tuple]]]
    questions: list[tuple[str, str, str, str]]  # (question, evidence, SQL, difficulty)


DATABASES: tuple[DemoDatabase, ...] = (
    DemoDatabase("cycling_club", CYCLING_TABLES, cycling_rows, CYCLING_QUESTIONS),
    DemoDatabase("village_library", LIBRARY_TABLES, library_rows, LIBRARY_QUESTIONS),
)


def build_database(path: Path, tables: tuple[Table, ...], rows: dict[str, list[tuple]]) -> None:
    """Create the SQLite file at ``path`` (must not exist), with stable bytes."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("BEGIN")
        for table in tables:
            conn.execute(create_statement(table))
            marks = ", ".join("?" * len(table.columns))
            conn.executemany(f"INSERT INTO {quote(table.name)} VALUES ({marks})", rows[table.name])
        conn.execute("COMMIT")
        problems = conn.execute("PRAGMA foreign_key_check").fetchall()
        if problems:
            raise RuntimeError(f"foreign key violations: {problems[:5]}")
        conn.execute("VACUUM")
    finally:
        conn.close()


def _read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path.as_uri() + "?mode=ro", uri=True)


def tables_json(db_path: Path, database: DemoDatabase) -> dict:
    """The BIRD/Spider tables.json entry for one database, read from the file itself."""
    readable = {(t.name, c.name): c.readable or c.name.replace("_", " ") for t in database.tables for c in t.columns}
    conn = _read_only(db_path)
    try:
        names = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid")]
        entry = {"db_id": database.db_id, "table_names_original": names,
                 "table_names": [n.lower().replace("_", " ") for n in names],
                 "column_names_original": [[-1, "*"]], "column_names": [[-1, "*"]], "column_types": ["text"],
                 "primary_keys": [], "foreign_keys": []}
        index: dict[tuple[str, str], int] = {}
        for t, table in enumerate(names):
            key = []
            for _, col, col_type, _, _, pk in conn.execute(f"PRAGMA table_info({quote(table)})").fetchall():
                index[(table, col)] = len(entry["column_names_original"])
                entry["column_names_original"].append([t, col])
                entry["column_names"].append([t, readable.get((table, col), col.replace("_", " ")).lower()])
                entry["column_types"].append(col_type.lower())
                if pk:
                    key.append((pk, index[(table, col)]))
            if key:
                ordered = [i for _, i in sorted(key)]
                entry["primary_keys"].append(ordered[0] if len(ordered) == 1 else ordered)
        for table in names:
            for fk in conn.execute(f"PRAGMA foreign_key_list({quote(table)})").fetchall():
                entry["foreign_keys"].append([index[(table, fk[3])], index[(fk[2], fk[4])]])
        return entry
    finally:
        conn.close()


def description_csv(table: Table) -> str:
    """BIRD's database_description/<table>.csv text for one table."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(DESCRIPTION_HEADER)
    for c in table.columns:
        writer.writerow([c.name, c.readable, c.description, c.type.lower(), c.values])
    return buffer.getvalue()


def question_records(db_path: Path, database: DemoDatabase, first_id: int) -> list[dict]:
    """One database's dev.json records, after checking that every gold SQL runs and returns rows."""
    conn = _read_only(db_path)
    records = []
    try:
        for question_id, (question, evidence, sql, difficulty) in enumerate(database.questions, start=first_id):
            if not conn.execute(sql).fetchall():
                raise RuntimeError(f"gold SQL of question {question_id} returns no rows: {sql}")
            records.append({"question_id": question_id, "db_id": database.db_id, "question": question,
                            "evidence": evidence, "SQL": sql, "difficulty": difficulty})
    finally:
        conn.close()
    return records


class NotTheDemos(ValueError):
    """The output folder's dev.json holds questions the demo does not: writing would lose them."""


def _check_only_demo_questions(data_file: Path) -> None:
    """NotTheDemos when ``data_file`` exists outside the project's own demo folder and is not a demo's dev.json."""
    from t2s.settings import DEMO_DIR

    if not data_file.is_file() or data_file.parent.resolve() == DEMO_DIR.resolve():  # the project's own: rewritten
        return
    try:
        rows = json.loads(data_file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        raise NotTheDemos(f"Error: {data_file} is there but not a JSON list of questions; make-demo writes over no "
                          "file it cannot read: remove it, or choose another folder") from None
    ours = {(database.db_id, question, sql) for database in DATABASES for question, _, sql, _ in database.questions}

    def demo_question(record) -> bool:  # one of the demo's own questions, word for word (not a user's on its databases)
        key = (record.get("db_id"), record.get("question"), record.get("SQL")) if isinstance(record, dict) else ()
        return len(key) == 3 and all(isinstance(part, str) for part in key) and key in ours

    if not isinstance(rows, list) or not all(demo_question(r) for r in rows):
        raise NotTheDemos(f"Error: {data_file} holds questions that are not the demo's; writing the demo there would "
                          "lose them: choose another folder")


def write_demo(output: Path, databases: tuple[DemoDatabase, ...] | None = None) -> list[dict]:
    """Write the demo data set (default: every database in ``DATABASES``) under ``output``; returns dev.json's records.

    Every database is built into a temporary file and its questions checked before anything is moved into place. A
    ``dev.json`` already there that holds other questions (a user's data) is never written over (``NotTheDemos``).
    """
    from t2s.data.rows import write_text_whole

    _check_only_demo_questions(output / "dev.json")
    databases = DATABASES if databases is None else databases
    staged: list[tuple[Path, Path]] = []  # (temporary file, final path)
    records: list[dict] = []
    try:
        for database in databases:
            db_folder = output / "dev_databases" / database.db_id
            db_folder.mkdir(parents=True, exist_ok=True)
            handle, tmp_name = tempfile.mkstemp(suffix=".sqlite.tmp", dir=db_folder)
            os.close(handle)
            tmp_path = Path(tmp_name)
            tmp_path.unlink()
            staged.append((tmp_path, db_folder / f"{database.db_id}.sqlite"))
            build_database(tmp_path, database.tables, database.rows())
            records += question_records(tmp_path, database, len(records))
        for tmp_path, db_path in staged:
            os.replace(tmp_path, db_path)
    finally:
        for tmp_path, _ in staged:
            tmp_path.unlink(missing_ok=True)
    entries = []
    for database, (_, db_path) in zip(databases, staged):
        for table in database.tables:
            write_text_whole(db_path.parent / "database_description" / f"{table.name}.csv", description_csv(table))
        entries.append(tables_json(db_path, database))
    write_text_whole(output / "dev_tables.json", json.dumps(entries, indent=2) + "\n")
    write_text_whole(output / "dev.json", json.dumps(records, indent=4, ensure_ascii=False) + "\n")
    return records

-- Seed 002 (Cumulus), Example 3 (SSB-like): total revenue by part category and year.
--   SELECT P.partcat, D.year, SUM(revenue) FROM Date D, Part P, LineOrder L
--   WHERE D.datekey=L.datekey AND P.partkey=L.partkey GROUP BY P.partcat, D.year;
-- "Date" is spelled dates (a keyword). LineOrder may hold duplicate tuples. Like Example 1, the
-- hand program is correct only when dates and parts arrive before the lineorders that use them.

-------------------- SOURCES --------------------
CREATE STREAM dates(datekey int NOT NULL, year int);
CREATE STREAM part(partkey int NOT NULL, partcat text);
CREATE STREAM lineorder(datekey int NOT NULL, partkey int NOT NULL, revenue decimal(10,2));

-------------------- MAPS --------------------
DECLARE MAP m(decimal(38,2))[][partcat:text, year:int] :=
    AggSum([partcat, year], dates(datekey, year) * part(partkey, partcat)
           * lineorder(datekey, partkey, revenue) * revenue);
DECLARE MAP mPL(int)[][datekey:int, year:int] := AggSum([datekey, year], dates(datekey, year));
DECLARE MAP mDL(int)[][partkey:int, partcat:text] :=
    AggSum([partkey, partcat], part(partkey, partcat));

-------------------- QUERIES --------------------
DECLARE QUERY m := m(decimal(38,2))[][partcat, year];

-------------------- TRIGGERS --------------------
ON + dates(datekey, year) {
    mPL[][datekey, year] += 1;
}
ON + part(partkey, partcat) {
    mDL[][partkey, partcat] += 1;
}
ON + lineorder(datekey, partkey, revenue) {
    -- (partcat: Part.partcat, year: Date.year): two loop variables, one per map
    m[][partcat, year] += revenue * mDL[][partkey, partcat] * mPL[][datekey, year];
}

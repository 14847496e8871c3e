-- Seed 002 (Cumulus), Example 2: for each supplier, the number of customers of its nation.
--   SELECT S.sid, SUM(1) FROM Customer C, Supplier S WHERE C.nation = S.nation GROUP BY S.sid;
-- Correct for any insertion order: the loop variable sid ranges over the slice qC[*, nation].

-------------------- SOURCES --------------------
CREATE STREAM customer(cid int NOT NULL, nation int NOT NULL);
CREATE STREAM supplier(sid int NOT NULL, nation int NOT NULL);

-------------------- MAPS --------------------
DECLARE MAP q(int)[][sid:int] := AggSum([sid], customer(cid, nation) * supplier(sid, nation));
DECLARE MAP qC(int)[][sid:int, nation:int] := AggSum([sid, nation], supplier(sid, nation));
DECLARE MAP qS(int)[][nation:int] := AggSum([nation], customer(cid, nation));

-------------------- QUERIES --------------------
DECLARE QUERY q := q(int)[][sid];

-------------------- TRIGGERS --------------------
ON + customer(cid, nation) {
    q[][sid] += qC[][sid, nation];       -- (sid: Supplier.sid)
    qS[][nation] += 1;
}
ON + supplier(sid, nation) {
    q[][sid] += qS[][nation];
    qC[][sid, nation] += 1;
}

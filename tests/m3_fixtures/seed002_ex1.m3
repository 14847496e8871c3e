-- Seed 002 (Cumulus), Example 1: the number of LineItems per customer id.
--   SELECT C.cid, SUM(1) FROM Customer C, Order O, LineItem L
--   WHERE C.cid=O.cid AND O.oid=L.oid GROUP BY C.cid;
-- "Order" is spelled orders (a SQL keyword). The seed's domain annotation (cid: Customer.cid)
-- is the loop variable cid ranging over the slice qL[*, oid]. The hand program is correct only
-- when every customer arrives before its orders and every order before its lineitems: it has no
-- rule for a parent that arrives after its children (tests/test_m3_seeds.py shows both).

-------------------- SOURCES --------------------
CREATE STREAM customer(cid int NOT NULL, nation int);
CREATE STREAM orders(oid int NOT NULL, cid int NOT NULL);
CREATE STREAM lineitem(oid int NOT NULL, lid int NOT NULL);

-------------------- MAPS --------------------
DECLARE MAP q(int)[][cid:int] :=
    AggSum([cid], customer(cid, nation) * orders(oid, cid) * lineitem(oid, lid));
DECLARE MAP qO1(int)[][cid:int] := AggSum([cid], customer(cid, nation));
DECLARE MAP qL(int)[][cid:int, oid:int] :=
    AggSum([cid, oid], customer(cid, nation) * orders(oid, cid));

-------------------- QUERIES --------------------
DECLARE QUERY q := q(int)[][cid];

-------------------- TRIGGERS --------------------
ON + customer(cid, nation) {
    qO1[][cid] += 1;
}
ON + orders(oid, cid) {
    qL[][cid, oid] += qO1[][cid];
}
ON + lineitem(oid, lid) {
    q[][cid] += qL[][cid, oid];          -- (cid: Customer.cid)
}

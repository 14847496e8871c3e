-- Seed 003 (DBToaster, "Agile views", §3.1): the transition program for the simplified TPC-H Q3
--   select l.ordkey, o.sprior, sum(l.extprice)
--   from Customer c, Orders o, Lineitem l
--   where c.custkey = o.custkey and l.ordkey = o.ordkey
--   group by l.ordkey, o.sprior
-- "for all possible insertion orderings" (listing lines 1-18). Deletions are "symmetric to
-- insertions except that they decrement counts" and are omitted, as in the seed. The statements
-- are the seed's, written in M3 syntax; the map definitions are the queries the seed's text
-- gives for them (m = q, m_c = q_c, m_cl = q_cl / @ep, m_l = q_l, m_o and m_co the two scalar
-- subqueries of the factorized q_o), with the trigger parameters as keys.

-------------------- SOURCES --------------------
CREATE STREAM customer(custkey int NOT NULL, name text, nationkey int, acctbal decimal(12,2));
CREATE STREAM lineitem(ordkey int NOT NULL, extprice decimal(12,2) NOT NULL);
CREATE STREAM orders(custkey int NOT NULL, ordkey int NOT NULL, sprior int);

-------------------- MAPS --------------------
DECLARE MAP m(decimal(38,2))[][ordkey:int, sprior:int] :=
    AggSum([ordkey, sprior], customer(custkey, name, nationkey, acctbal)
           * orders(custkey, ordkey, sprior) * lineitem(ordkey, extprice) * extprice);
DECLARE MAP m_c(decimal(38,2))[][custkey:int, ordkey:int, sprior:int] :=
    AggSum([custkey, ordkey, sprior], orders(custkey, ordkey, sprior)
           * lineitem(ordkey, extprice) * extprice);
DECLARE MAP m_l(int)[][ordkey:int, sprior:int] :=
    AggSum([ordkey, sprior], customer(custkey, name, nationkey, acctbal)
           * orders(custkey, ordkey, sprior));
DECLARE MAP m_cl(int)[][custkey:int, ordkey:int, sprior:int] :=
    AggSum([custkey, ordkey, sprior], orders(custkey, ordkey, sprior));
DECLARE MAP m_o(int)[][custkey:int] :=
    AggSum([custkey], customer(custkey, name, nationkey, acctbal));
DECLARE MAP m_co(decimal(38,2))[][ordkey:int] :=
    AggSum([ordkey], lineitem(ordkey, extprice) * extprice);

-------------------- QUERIES --------------------
DECLARE QUERY q3 := m(decimal(38,2))[][ordkey, sprior];

-------------------- TRIGGERS --------------------
ON + customer(ck, nm, nk, bal) {                        -- 1. on_insert_customer(ck,nm,nk,bal)
    m[][ordkey, sprior] += m_c[][ck, ordkey, sprior];   -- 2-3.
    m_l[][ordkey, sprior] += m_cl[][ck, ordkey, sprior];-- 4-5.
    m_o[][ck] += 1;                                     -- 6.
}
ON + lineitem(ok, ep) {                                 -- 8. on_insert_lineitem(ok,ep)
    m[][ok, sprior] += ep * m_l[][ok, sprior];          -- 9.
    m_c[][custkey, ok, sprior] +=
        ep * m_cl[][custkey, ok, sprior];               -- 10-11.
    m_co[][ok] += ep;                                   -- 12.
}
ON + orders(ck, ok, sp) {                               -- 14. on_insert_order(ck,ok,sp)
    m[][ok, sp] += m_co[][ok] * m_o[][ck];              -- 15.
    m_l[][ok, sp] += m_o[][ck];                         -- 16.
    m_c[][ck, ok, sp] += m_co[][ok];                    -- 17.
    m_cl[][ck, ok, sp] += 1;                            -- 18.
}

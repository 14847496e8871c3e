-- Seed 000, Example 3.3: S(1) at TS2 and TS3, then a corrective message for m2[1] at TS1.
-------------------- SOURCES --------------------
CREATE STREAM S(A int);
-------------------- MAPS --------------------
DECLARE MAP m1(int)[][A:int];
DECLARE MAP m2(int)[][A:int];
DECLARE MAP m3(int)[][A:int];
-------------------- TRIGGERS --------------------
ON + S(A) {
    m1[][A] += m2[][A] * m3[][A];
}

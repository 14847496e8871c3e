-- Seed 000, Example 3.1: a loop over m3's domain (C is bound by m2 only); TS1: ON +R(1), TS2:
-- ON +S(2) -- a read-write violation if TS2 completes before TS1 reads m2[2].
-------------------- SOURCES --------------------
CREATE STREAM R(A int);
CREATE STREAM S(B int);
-------------------- MAPS --------------------
DECLARE MAP m1(int)[][A:int];
DECLARE MAP m2(int)[][C:int];
DECLARE MAP m3(int)[][C:int];
-------------------- TRIGGERS --------------------
ON + R(A) {
    m3[][C] += m1[][A] * m2[][C];
}
ON + S(B) {
    m2[][B] += 1;
}

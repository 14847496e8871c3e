-- Seed 000, Example 3.2 / Figure 6: S(1) then T(1); maps written in a cycle across triggers.
-------------------- SOURCES --------------------
CREATE STREAM S(A int);
CREATE STREAM T(B int);
-------------------- MAPS --------------------
DECLARE MAP m1(int)[][A:int];
DECLARE MAP m2(int)[][B:int];
-------------------- TRIGGERS --------------------
ON + S(A) {
    m1[][A] += m2[][A];
}
ON + T(B) {
    m2[][B] += m1[][B];
}

-- Seed 000 (distributed M3 protocol), Example 2.1: a trigger and its instantiation ON +R(10,20);
-- Figure 1 runs ON +R(1,4) at TS1 and ON +R(1,5) at TS2 (a write-read dependency on m2[1]).
-------------------- SOURCES --------------------
CREATE STREAM R(A int, B int);
-------------------- MAPS --------------------
DECLARE MAP m1(int)[][];
DECLARE MAP m2(int)[][A:int];
DECLARE MAP m3(int)[][B:int];
-------------------- TRIGGERS --------------------
ON + R(A, B) {
    m1[][] += m2[][A];
    m2[][A] += m3[][B];
}
